"""Whether an op can be judged in float64 and, if not, in which dtype.

Most CUDA and Triton kernels accept only float32 (or 16-bit) inputs: some
raise on float64, some compute in float32 whatever they get, some give
wrong float64 results without raising (only ``dtypes=`` on the marker can
say so). Each check that runs in float64 asks here first, once per sample
and device, and judges such an op in the most precise dtype it accepts.
"""

from dataclasses import dataclass

import torch

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
    cache = context.case.__dict__.setdefault("_float64_plans", {})
    key = (id(sample), context.device)
    if key not in cache:
        cache[key] = _float64_plan(context, sample)
    return cache[key]


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
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, context.generator))
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
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, context.generator))
    except OpRaised:
        return False
    return True

