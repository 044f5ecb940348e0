"""Elements nearer the op's domain edge than a step: found by bisection, so the derivative checks can leave them out.

``sqrt`` or ``log`` of ``torch.rand`` values holds elements nearer 0 than
any step central differences can afford; moved by the step, the outputs
turn inf/NaN while the op is right. Both derivative engines (float64
probing and float32 judging) first try finer steps, then, for the few
elements no step reaches, ask this bisection which they are.
"""

from pytest_autograd.results.compare import fmt, fmt_index

DOMAIN_SHRINKS = (16, 256, 4096)  # finer steps tried, in turn, where a step leaves the op's domain
DOMAIN_EDGES = 8  # elements left out, at most: past that the non-finite differences stand as they are


def well_inside(measure, eps):
    """(True, the measurement one shrink finer than the first of ``eps / DOMAIN_SHRINKS`` where it is finite),
    or the first finite one when no finer one is, or (False, the finest tried) when none is. ``measure(step)``
    returns (finite, measurement). Curvature near a domain edge grows like 1/distance: the step must be well
    inside it, not just inside."""
    inside = tried = None
    for shrink in DOMAIN_SHRINKS:
        finite, tried = measure(eps / shrink)
        if finite and inside is None and shrink != DOMAIN_SHRINKS[-1]:
            inside = tried
        elif finite:
            return True, tried
        elif inside is not None:
            return True, inside
    return False, tried


def edge_examples(evaluator, names, flats):
    """"x[3, 4] = 1e-13, ..." for up to three flat indices over an Evaluator's leaves."""
    examples = []
    for flat in flats[:3]:
        j, index = evaluator.leaf_of(flat)
        value = evaluator.base[j].reshape(-1)[flat - evaluator.offsets[j]]
        examples.append(f"{names[j]}{fmt_index(index)} = {fmt(float(value))}")
    return ", ".join(examples)


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
