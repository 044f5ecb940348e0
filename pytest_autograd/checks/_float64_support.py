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

from pytest_autograd.checks._fewer_rows import whole_of
from pytest_autograd.engine.execution import OpRaised, grads_of, random_cotangents
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
    sample = whole_of(context.case, sample)  # the first rows of a sample are planned as the sample
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


def plan_known(context, sample):
    """Whether ``float64_plan`` answers for ``sample`` without running the op (this case or its test asked)."""
    sample = whole_of(context.case, sample)
    if (id(sample), context.device) in context.case.__dict__.get("_float64_plans", {}):
        return True
    shared = _shared_key(context, sample)
    return shared is not None and shared in _SHARED


SHARED_PLANS = 256  # plans kept for the items still to come
_SHARED = OrderedDict()  # what a plan depends on (see _shared_key) -> the plan


def _shared_key(context, sample):
    """What the plan depends on, so that the items of one test (one per check; under xdist, or with samples that
    differ between calls of the body, each with its own values) ask the op once: the test with its own parameters,
    the op, the device, the marker options that change how it runs,
    and the sample's kinds of arguments (a tensor's shape, dtype and layout, a plain value itself). None for a
    case no other shares with, or an argument not plain enough to tell (then every item asks the op)."""
    case = context.case
    if case.shared_by is None:
        return None
    try:
        signature = tuple(_signature(value) for value in sample.args), \
            tuple((name, _signature(value)) for name, value in sorted(sample.kwargs.items()))
        key = (case.shared_by, case.op, str(context.device), frozenset(case.constant_slots),
               repr(case.option("mutates")), repr(case.option("dtypes")), signature)
        hash(key)
    except (TypeError, _NotPlain):
        return None
    return key


def own_generator():
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
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, own_generator(), repeating=True))
    except OpRaised as raised:
        return _plan_for_raising(context, sample, raised, declared)
    finally:
        context.dtype = None
    return None


def plan_after_raising(context, sample, raised):
    """The plan of an op whose float64 run raised ``raised`` (an OpRaised), now ``float64_plan``'s answer for
    ``sample`` too: the most precise lower dtype it runs in, or None (the float64 path reports the error)."""
    try:
        plan = _plan_for_raising(context, sample, raised, declared_dtypes(context.case))
    finally:
        context.dtype = None
    adopt(context, sample, plan)
    return plan


def _plan_for_raising(context, sample, raised, declared):
    if declared is not None:
        return None
    for dtype in LOW_DTYPES:
        if runs_in(context, sample, dtype):
            first = str(raised.error).strip().splitlines()[0] if str(raised.error).strip() else ""
            return Plan(dtype, f"the op's {raised.phase} raises on float64 ({type(raised.error).__name__}: "
                               f"{first[:120]})")
    return None


def runs_in(context, sample, dtype):
    """Whether the op runs forward and backward on ``sample`` in ``dtype`` (leaves ``context.dtype`` set)."""
    prepared = context.prepare(sample, dtype=dtype)
    try:
        outputs = context.run_op(prepared)
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, own_generator(), repeating=True))
    except OpRaised:
        return False
    return True


def adopted(context, sample):
    """The plan this item knows for ``sample`` (``float64_plan``'s answer, or one ``adopt`` made it), or None."""
    sample = whole_of(context.case, sample)
    return context.case.__dict__.get("_float64_plans", {}).get((id(sample), context.device))


def adopt(context, sample, plan):
    """Make ``plan`` the answer of ``float64_plan`` for ``sample``, for this item and the rest of its test."""
    sample = whole_of(context.case, sample)
    context.case.__dict__.setdefault("_float64_plans", {})[(id(sample), context.device)] = plan
    shared = _shared_key(context, sample)
    if shared is not None:
        _SHARED[shared] = plan
