"""Whether an op can be judged in float64 and, if not, in which dtype.

Most CUDA and Triton kernels accept only float32 (or 16-bit) inputs: some
raise on float64, some compute in float32 whatever they get, some give
wrong float64 results without raising (only ``dtypes=`` on the marker can
say so). Each check that runs in float64 asks here first, once per sample
and device, and judges such an op in the most precise dtype it accepts.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from pytest_autograd.engine.execution import OpRaised, flatten_outputs, grads_of, random_cotangents
from pytest_autograd.results.compare import dtype_label

LOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # most precise first

STRATEGY_REFERENCE = "gradients in {dtype} against the reference's float64 gradients on the same rounded inputs"
STRATEGY_DIFFERENCES = ("central differences in {dtype} at three step sizes, tolerance from the measured spread "
                        "between them")


@dataclass
class Plan:
    """Why float64 cannot judge this op, and the dtype that will."""

    dtype: torch.dtype
    reason: str

    def strategy(self, has_reference):
        template = STRATEGY_REFERENCE if has_reference else STRATEGY_DIFFERENCES
        return template.format(dtype=dtype_label(self.dtype))

    def note(self, check, has_reference):
        return (f"{check}: {self.reason}; judged by {self.strategy(has_reference)}")


def declared_dtypes(case):
    """The dtypes ``dtypes=`` declares, most precise first; None when the marker declares none."""
    if case.option("dtypes") is None:
        return None
    from pytest_autograd.checks._transforms import check_dtypes

    low, _ = check_dtypes(case, "cpu")
    wanted = case.option("dtypes")
    wanted = [wanted] if isinstance(wanted, (str, torch.dtype)) else list(wanted)
    has_float64 = any(entry in (torch.float64, "float64", "double") for entry in wanted)
    return sorted(low + [torch.float64] * has_float64, key=lambda d: torch.finfo(d).eps)


def float64_plan(context, sample):
    """None when the op computes in float64 on ``sample``; else the Plan for judging it in a lower dtype.

    Detected from ``dtypes=`` without float64, from an op (forward or
    backward) that raises on float64 but runs in a lower dtype, or from
    outputs below float64 for float64 inputs. An op that raises in every
    dtype is left to the float64 path, which reports its error.
    """
    cache = context.case.__dict__.setdefault("_float64_plans", {})
    key = (id(sample), context.device)
    if key not in cache:
        shared = _shared_key(context, sample)
        if shared is not None and shared in _SHARED:
            _SHARED.move_to_end(shared)
            cache[key] = _SHARED[shared]
        else:
            cache[key] = _float64_plan(context, sample)
            if shared is not None:
                _SHARED[shared] = cache[key]
                while len(_SHARED) > SHARED_PLANS:
                    _SHARED.popitem(last=False)
    return cache[key]


SHARED_PLANS = 256  # plans kept for the items still to come
_SHARED = OrderedDict()  # what a plan depends on (see _shared_key) -> the plan


def _shared_key(context, sample):
    """What the plan depends on, so that the items of one test (one per check, each with its own draw of the
    sample's values) ask the op once: the test, the op, the device, the marker options that change how it runs,
    and the sample's kinds of arguments (a tensor's shape, dtype and layout, a plain value itself). None for a
    case no other shares with, or an argument not plain enough to tell (then every item asks the op)."""
    case = context.case
    if case.shared_by is None:
        return None
    try:
        signature = tuple(_signature(value) for value in sample.args), \
            tuple((name, _signature(value)) for name, value in sorted(sample.kwargs.items()))
        key = (case.shared_by, case.op, str(context.device), frozenset(case.constant_slots), repr(case.option("mutates")),
               repr(case.option("dtypes")), signature)
        hash(key)
    except (TypeError, _NotPlain):
        return None
    return key


def _own_generator():
    """The cotangents of a plan's trial backward come from a generator of its own: whether a check found the
    plan or was handed it by an earlier item of its test, its own draws stay the same (its rerun line
    reproduces what the full run showed)."""
    return torch.Generator().manual_seed(PLAN_SEED)


PLAN_SEED = 0x5EED


class _NotPlain(Exception):
    pass


def _signature(value):
    if isinstance(value, torch.Tensor):
        return "tensor", tuple(value.shape), value.dtype, value.layout, value.requires_grad
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_signature(item) for item in value)
    raise _NotPlain


def sample_dtype(context, sample):
    """The sample's own dtype, or the plan's when the sample is float64 and the op cannot run in it."""
    from pytest_autograd.engine.execution import floating_dtype

    dtype = floating_dtype(sample)
    if dtype == torch.float64:
        plan = float64_plan(context, sample)
        if plan is not None:
            return plan.dtype
    return dtype


def _float64_plan(context, sample):
    declared = declared_dtypes(context.case)
    if declared is not None and torch.float64 not in declared:
        listed = ", ".join(dtype_label(d) for d in declared)
        return Plan(declared[0], f"dtypes=({listed}) on the marker declares no float64")
    prepared = context.prepare(sample, dtype=torch.float64)
    try:
        outputs = context.run_op(prepared)
        lower = sorted({o.dtype for o in outputs if o.is_floating_point() and o.dtype != torch.float64},
                       key=lambda d: torch.finfo(d).eps)
        if lower:
            return Plan(lower[0], f"the op returns {'/'.join(dtype_label(d) for d in lower)} outputs for float64 "
                                  "inputs")
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, _own_generator()))
    except OpRaised as raised:
        if declared is not None:
            return None
        for dtype in LOW_DTYPES:
            if _runs_in(context, sample, dtype):
                first = str(raised.error).strip().splitlines()[0] if str(raised.error).strip() else ""
                return Plan(dtype, f"the op's {raised.phase} raises on float64 ({type(raised.error).__name__}: "
                                   f"{first[:120]})")
        return None
    finally:
        context.dtype = None
    return None


def _runs_in(context, sample, dtype):
    prepared = context.prepare(sample, dtype=dtype)
    try:
        outputs = context.run_op(prepared)
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, _own_generator()))
    except OpRaised:
        return False
    return True



# ---------------------------------------------------------------------------
# Ops that take float64 but compute (part of) it in float32
# ---------------------------------------------------------------------------

BELOW_FLOAT32 = 2.0 ** -27  # a relative move a quarter of float32's half-ulp: float32 rounds it away
RESOLVED = 2.0 ** -12  # a relative move float32 resolves, small enough for a central difference
AGREEMENT = 0.01  # float64 arithmetic gives both differences alike, to about 1e-7


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
    if any(value.dtype == torch.float64 for value in _floating(sample)):
        return None
    prepared = context.prepare(sample, dtype=torch.float64, requires_grad=False)
    moved = _differentiated_slots(context, prepared)
    try:
        with torch.no_grad():
            base = _float64_outputs(context, prepared, {}, 0.0)
            if base is None or not _same(base, _float64_outputs(context, prepared, {}, 0.0)):
                return None  # not the same twice (random numbers): no difference can be told from noise
            generator = _own_generator()
            shifts = {slot: 1.0 + torch.rand(_value(prepared, slot).shape, generator=generator, dtype=torch.float64)
                      for slot in moved}
            tiny, resolved = (_central_difference(context, prepared, shifts, step)
                              for step in (BELOW_FLOAT32, RESOLVED))
    except OpRaised:
        return None
    finally:
        context.dtype = None
    if tiny is None or resolved is None:
        return None
    scale = sum(float(r.square().sum()) for r in resolved)
    apart = sum(float((t - r).square().sum()) for t, r in zip(tiny, resolved))
    if scale == 0.0 or not apart > AGREEMENT ** 2 * scale:
        return None  # outputs that do not move, or move alike at both steps: float64 arithmetic
    return Plan(torch.float32, "the op computes (part of) its forward in float32 for float64 inputs (its float64 "
                               "outputs miss input changes below float32's resolution)")


def _central_difference(context, prepared, shifts, step):
    """Per float64 output, ``(f(x * (1 + step * shift)) - f(x * (1 - step * shift))) / (2 * step)``, zero where
    not finite; None when the op returns no float64 output."""
    plus = _float64_outputs(context, prepared, shifts, step)
    minus = _float64_outputs(context, prepared, shifts, -step)
    if plus is None or minus is None or len(plus) != len(minus):
        return None
    found = []
    for p, m in zip(plus, minus):
        difference = (p - m) / (2 * step)
        found.append(torch.where(difference.isfinite(), difference, torch.zeros_like(difference)))
    return found


def adopt(context, sample, plan):
    """Make ``plan`` the answer of ``float64_plan`` for ``sample``, for this item and the rest of its test."""
    float64_plan(context, sample)  # the entry exists, shared where it can be
    cache = context.case.__dict__["_float64_plans"]
    cache[(id(sample), context.device)] = plan
    shared = _shared_key(context, sample)
    if shared is not None:
        _SHARED[shared] = plan


def _floating(sample):
    return [value for value in list(sample.args) + list(sample.kwargs.values())
            if isinstance(value, torch.Tensor) and value.is_floating_point()]


def _differentiated_slots(context, prepared):
    return [slot for slot in list(range(len(prepared.args))) + list(prepared.kwargs)
            if isinstance(_value(prepared, slot), torch.Tensor) and _value(prepared, slot).is_floating_point()
            and slot not in context.case.constant_slots]


def _value(prepared, slot):
    return prepared.args[slot] if isinstance(slot, int) else prepared.kwargs[slot]


def _float64_outputs(context, prepared, shifts, step):
    """The op's float64 outputs with each argument in ``shifts`` multiplied by ``1 + step * shift``."""
    args, kwargs = prepared.call_args(leaves=[], clone=True)
    for slot, shift in shifts.items():
        value = _value(prepared, slot) * (1.0 + step * shift)
        if isinstance(slot, int):
            args[slot] = value
        else:
            kwargs[slot] = value
    outputs = [o for o in flatten_outputs(_call(context, args, kwargs)) if o.dtype == torch.float64]
    return outputs or None


def _call(context, args, kwargs):
    try:
        return context.case.call(*args, **kwargs)
    except Exception as error:
        raise OpRaised("forward", error) from error


def _same(first, second):
    return len(first) == len(second) and all(a.shape == b.shape and bool(torch.equal(a, b))
                                              for a, b in zip(first, second))
