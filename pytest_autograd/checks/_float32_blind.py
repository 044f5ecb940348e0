"""Ops that take float64 but compute (part of) it in float32, found after a check failed in float64.

A kernel that loads an activation ``.to(float32)`` and multiplies by a
tensor left in its own dtype (liger-kernel's SwiGLU), or one that computes
in float32 and casts back, returns float64 tensors for float64 inputs: the
float64 plan (``_float64_support``) cannot see it before the run. Its
float64 finite differences then measure float32 rounding, and a check
fails for its own choice of float64. :func:`float32_blind_plan` tells such
an op from a wrong one, so the check judges it in float32 instead (or in
bfloat16 or float16, for a kernel that rounds its inputs to one of those).
"""

import torch

from pytest_autograd.checks._float64_support import Plan, own_generator, runs_in
from pytest_autograd.engine.execution import OpRaised, floating_tensors
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import dtype_label

BELOW_FLOAT32 = 2.0 ** -27  # a relative move a quarter of float32's half-ulp: float32 rounds it away
RESOLVED = 2.0 ** -12  # a relative move float32 resolves, small enough for a central difference
# (dtype, a relative move it rounds away, one it resolves), coarsest first: a kernel computing in bfloat16 misses
# float16's and float32's small moves too, so the coarsest dtype that misses its own is the one it computes in.
LEVELS = ((torch.bfloat16, 2.0 ** -11, 2.0 ** -6), (torch.float16, 2.0 ** -13, 2.0 ** -8),
          (torch.float32, BELOW_FLOAT32, RESOLVED))
FLOAT32_EPS = torch.finfo(torch.float32).eps
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
    is missing from the first (or adds a whole ulp to it). The 16-bit dtypes are asked first, each with moves of
    its own size (``LEVELS``), and taken where the smaller move leaves the outputs exactly unmoved. A sample the
    user gave in float64 asks for float64: not asked.
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
            for dtype, below, resolves in LEVELS:
                if _blind_at(context, prepared, base, shifts, below, resolves, whole=dtype != torch.float32) \
                        and (dtype == torch.float32 or _takes(context, sample, dtype)):
                    return Plan(dtype, f"the op computes (part of) its forward in {dtype_label(dtype)} for float64 "
                                       f"inputs (its float64 outputs miss input changes below {dtype_label(dtype)}'s "
                                       "resolution)")
    except (OpRaised, UsageProblem):
        return None
    finally:
        context.dtype = None
    return None


def _blind_at(context, prepared, base, shifts, below, resolves, whole):
    """Whether the op's outputs miss the relative move ``below`` that float64 arithmetic would show, in a share of
    the outputs that move at ``resolves``: ``whole``, they do not move at all (the whole forward rounds its
    inputs; asked of the 16-bit dtypes, whose moves are large enough for any op to curve over); else their
    central difference differs from the one at ``resolves`` (a part of the forward rounds)."""
    tiny, resolved = (_central_difference(context, prepared, shifts, step) for step in (below, resolves))
    if tiny is None or resolved is None or len(base) != len(resolved):
        return False
    if whole:  # the outputs whose move at ``below`` float32 would show (8 ulps of it): a flat one (tanh
        # saturated) does not move in float32 either
        shows = [(2 * below * r).abs() > 8 * FLOAT32_EPS * o.abs() for r, o in zip(resolved, base)]
        moving = sum(int(s.sum()) for s in shows)
        missed = sum(int(((t == 0) & s).sum()) for t, s in zip(tiny, shows))
    else:  # outputs that move alike at both steps: float64 arithmetic (a kink that one element's larger move
        moving = sum(int(torch.count_nonzero(r)) for r in resolved)
        missed = _apart(tiny, resolved)  # crosses makes that element, not a share of them, differ)
    return bool(moving) and missed > BLIND_SHARE * moving


def _takes(context, sample, dtype):
    """Whether the op runs forward and backward on ``sample`` in a 16-bit ``dtype`` (float32, the sample's own
    dtype, needs no asking)."""
    with torch.enable_grad():
        return runs_in(context, sample, dtype)


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


def plan_after_float64_pass(context, sample, notes, noted_before, zero_gradient=False):
    """After a float64 pass that noted kinks or jumps (``notes.lines`` beyond ``noted_before``), passed a probe
    only within a wide tolerance (``notes.blurred``: quantised outputs are noisy) or found an argument's gradient
    all zero (``zero_gradient``): the plan to judge ``sample`` in the dtype the op computes in
    when it computes below float64, adopted for the rest of the item, its kink notes withdrawn; else None.

    Such an op's float64 outputs are quantised: over a float64 step they move by 0 or by a whole ulp, which read
    as kinks everywhere (a zero backward passed between them), or, below a 16-bit dtype's resolution, not at
    all (a zero backward matched them exactly)."""
    blurred, notes.blurred = notes.blurred, False  # asked once per pass
    if len(notes.lines) <= noted_before and not zero_gradient and not blurred:
        return None
    plan = float32_instead(context, sample)
    if plan is not None:
        del notes.lines[noted_before:]
    return plan


def float32_instead(context, sample):
    """``float32_blind_plan`` for ``sample``, asked without touching the caller's random state, adopted when
    found (every later check of the item and of its test judges the sample in the plan's dtype). A plan adopted
    already is the answer: asked again (sizes, then the runner judging the check anew) it would say the same."""
    from pytest_autograd.checks._float64_support import adopt, adopted
    from pytest_autograd.engine.devices import cuda_devices
    from pytest_autograd.engine.torch_noise import quiet_torch_machinery

    known = adopted(context, sample)
    if known is not None:
        return known
    with torch.random.fork_rng(devices=cuda_devices(context.device)), quiet_torch_machinery():
        plan = float32_blind_plan(context, sample)
    if plan is not None:
        adopt(context, sample, plan)
    return plan
