"""Ops that take float64 but compute (part of) it in float32, found after a check failed in float64.

A kernel that loads an activation ``.to(float32)`` and multiplies by a
tensor left in its own dtype (liger-kernel's SwiGLU), or one that computes
in float32 and casts back, returns float64 tensors for float64 inputs: the
float64 plan (``_float64_support``) cannot see it before the run. Its
float64 finite differences then measure float32 rounding, and a check
fails for its own choice of float64. :func:`float32_blind_plan` tells such
an op from a wrong one, so the check judges it in float32 instead.
"""

import torch

from pytest_autograd.checks._float64_support import Plan, own_generator
from pytest_autograd.engine.execution import OpRaised, floating_tensors
from pytest_autograd.engine.outcomes import UsageProblem

BELOW_FLOAT32 = 2.0 ** -27  # a relative move a quarter of float32's half-ulp: float32 rounds it away
RESOLVED = 2.0 ** -12  # a relative move float32 resolves, small enough for a central difference
AGREEMENT = 0.01  # float64 arithmetic gives both differences of an element alike, to about 1e-7
BLIND_SHARE = 0.1  # the share of moving output elements that must differ: float32 in them, not a kink crossed


def float32_blind_plan(context, sample):
    """A Plan to judge in float32 when the op, given float64 copies of a sample that is not float64, computes
    part of its forward in float32 (a kernel that loads an activation ``.to(float32)`` and multiplies by a
    tensor left in its own dtype); None when it computes in float64, or when the probe cannot tell.

    Asked only after a check failed in float64: finite differences of such an op measure float32 rounding, so
    the failure is the check's, not the op's. Every differentiated argument moves relative to its value along
    one random direction, by ``BELOW_FLOAT32`` (float32 rounds that away) and by ``RESOLVED`` (it does not):
    float64 arithmetic gives the same derivative from both central differences, to about 1e-7; a float32 part
    is missing from the first (or adds a whole ulp to it). A sample the user gave in float64 asks for float64:
    not asked.
    """
    if any(value.dtype == torch.float64 for value in floating_tensors(sample)):
        return None
    prepared = context.prepare(sample, dtype=torch.float64)
    if not prepared.leaves:
        return None
    try:
        with torch.no_grad():
            base = _outputs(context, prepared, [], 0.0)
            if base is None or not _same(base, _outputs(context, prepared, [], 0.0)):
                return None  # not the same twice (random numbers): no difference can be told from noise
            generator = own_generator()
            shifts = [1.0 + torch.rand(leaf.shape, generator=generator, dtype=torch.float64).to(leaf.device)
                      for leaf in prepared.leaves]  # drawn on the CPU: the same direction on every device
            tiny, resolved = (_central_difference(context, prepared, shifts, step)
                              for step in (BELOW_FLOAT32, RESOLVED))
    except (OpRaised, UsageProblem):
        return None
    finally:
        context.dtype = None
    if tiny is None or resolved is None:
        return None
    moving = sum(int(torch.count_nonzero(r)) for r in resolved)
    if not moving or not _apart(tiny, resolved) > BLIND_SHARE * moving:
        return None  # outputs that do not move, or move alike at both steps: float64 arithmetic (a kink that
        # one element's larger move crosses makes that element, not a share of them, differ)
    return Plan(torch.float32, "the op computes (part of) its forward in float32 for float64 inputs (its float64 "
                               "outputs miss input changes below float32's resolution)")


def _apart(tiny, resolved):
    """How many output elements' two central differences differ by more than ``AGREEMENT`` of the resolved one
    (or of a millionth of the resolved ones' root mean square, where that one is about 0)."""
    count = 0
    for t, r in zip(tiny, resolved):
        if r.numel() == 0:
            continue
        floor = 1e-6 * float(r.square().mean().sqrt())
        count += int(((t - r).abs() > AGREEMENT * r.abs() + floor).sum())
    return count


def _central_difference(context, prepared, shifts, step):
    """Per float64 output, ``(f(x * (1 + step * shift)) - f(x * (1 - step * shift))) / (2 * step)``, zero where
    not finite; None when the op returns no float64 output."""
    plus = _outputs(context, prepared, shifts, step)
    minus = _outputs(context, prepared, shifts, -step)
    if plus is None or minus is None or len(plus) != len(minus):
        return None
    found = []
    for p, m in zip(plus, minus):
        difference = (p - m) / (2 * step)
        found.append(torch.where(difference.isfinite(), difference, torch.zeros_like(difference)))
    return found


def _outputs(context, prepared, shifts, step):
    """The op's float64 outputs with each leaf multiplied by ``1 + step * shift`` (``shifts`` empty: as it is);
    None without one."""
    moved = [leaf.detach() * (1.0 + step * shift) for leaf, shift in zip(prepared.leaves, shifts)] if shifts \
        else [leaf.detach().clone() for leaf in prepared.leaves]
    outputs = [o for o in context.run_op(prepared, moved, clone_leaves=False) if o.dtype == torch.float64]
    return outputs or None


def _same(first, second):
    return len(first) == len(second) and all(a.shape == b.shape and bool(torch.equal(a, b))
                                              for a, b in zip(first, second))
