"""Who is wrong when op and reference disagree in a low dtype: judged against float64.

In float32 a textbook reference (``E[x^2] - E[x]^2``) can be off by 1e-2
where a careful op (two-pass variance) is right to 1e-7; comparing them
directly blames the op. As in the precision check, both run on exactly the
same rounded inputs and cotangents, and the reference's float64 run on those
values is the truth. The op is blamed only when it is farther from the truth
than the reference is and farther than the dtype's tolerance.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.results.compare import dtype_label, fmt, tolerance_for


@dataclass
class Verdict:
    """The reference is the farther one: ``worst`` names where, with both errors."""

    label: str
    op_error: float
    ref_error: float

    def note(self, dtype):
        return (f"reference: in {dtype_label(dtype)} the reference is less precise than the op "
                f"({self.label}: reference error {fmt(self.ref_error)}, op error {fmt(self.op_error)}, each "
                "normwise against the reference in float64 on the same rounded inputs); the op passes")


def reference_is_farther(context, sample, dtype):
    """A Verdict when every output and gradient of the op is at least as close to float64 as the reference's.

    None when the op is the farther one somewhere (or float64 cannot be run):
    the direct comparison's failure then stands.
    """
    from pytest_autograd.checks._transforms import (
        cast_sample,
        forward_and_backward,
        normwise_error,
        paired_tensors,
    )
    from pytest_autograd.engine.execution import OpRaised

    case = context.case
    low = cast_sample(sample, dtype)
    try:
        op_low, cotangents = forward_and_backward(context, low, dtype)
        ref_low, _ = forward_and_backward(context, low, dtype, cotangents, fn=case.reference)
        truth, _ = forward_and_backward(context, low, torch.float64, cotangents, fn=case.reference)
    except OpRaised:
        return None
    finally:
        context.dtype = None
    _, rtol = tolerance_for(dtype, case.option("atol"), case.option("rtol"))
    ref_errors = {pair.label: normwise_error(pair.expected, pair.got).value for pair in paired_tensors(truth, ref_low)}
    widest = None
    for pair in paired_tensors(truth, op_low):
        op_error = normwise_error(pair.expected, pair.got).value
        ref_error = ref_errors.get(pair.label)
        if ref_error is None:
            return None
        if op_error > max(ref_error, rtol):
            return None
        if widest is None or ref_error - op_error > widest.ref_error - widest.op_error:
            widest = Verdict(pair.label, op_error, ref_error)
    return widest
