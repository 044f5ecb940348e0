"""Elements nearer the op's domain edge than a step: found by bisection, so the derivative checks can leave them out.

``sqrt`` or ``log`` of ``torch.rand`` values holds elements nearer 0 than
any step central differences can afford; moved by the step, the outputs
turn inf/NaN while the op is right. Both derivative engines (float64
probing and float32 judging) first try finer steps, then, for the few
elements no step reaches, ask this bisection which they are.
"""

DOMAIN_EDGES = 8  # elements left out, at most: past that the non-finite differences stand as they are


def elements_leaving_the_domain(numel, stays_finite):
    """Sorted flat indices ``i`` whose step alone leaves the domain, where ``stays_finite(low, high)`` tells
    whether moving the elements ``low:high`` keeps the outputs finite; None when more than ``DOMAIN_EDGES`` do,
    or when none alone does. About two evaluations per half searched."""
    found, stack = [], [(0, numel)]
    while stack:
        low, high = stack.pop()
        if stays_finite(low, high):
            continue
        if high - low == 1:
            found.append(low)
            if len(found) > DOMAIN_EDGES:
                return None
            continue
        middle = (low + high) // 2
        stack += [(middle, high), (low, middle)]
    return sorted(found) or None
