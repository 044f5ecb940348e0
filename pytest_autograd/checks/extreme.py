"""extreme: no inf or NaN at large and tiny input magnitudes where the answer is finite.

Random samples of unit size never reach the range where a naive softmax's
``exp`` overflows or a norm's squares underflow. Every floating input is
scaled to a few magnitudes per dtype: just past where ``exp`` overflows,
``max ** 0.25 / 2`` (products of up to four inputs stay in range) and a
value whose square underflows to zero. Wherever the reference in the same dtype
(without one: the op in float64, if the value fits the dtype) is finite, the
op's outputs and gradients must be finite too.
"""

import math

import pytest
import torch

from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._transforms import (
    ReferenceRaised,
    cast_sample,
    check_dtypes,
    forward_and_backward,
    paired_tensors,
    unsupported_dtype,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.compare import dtype_label, fmt, fmt_index
from pytest_autograd.execution import OpRaised, has_floating_input


def magnitudes(dtype):
    """(name, largest |input|) pairs for ``dtype``, smallest first."""
    info = torch.finfo(dtype)
    found = {
        "tiny: squares underflow to 0": 0.5 * math.sqrt(info.tiny * info.eps),
        "large: exp overflows": 2 * math.log(info.max),
        "huge: products of four inputs still fit": info.max ** 0.25 / 2,
    }
    return sorted(found.items(), key=lambda item: item[1])


class Extreme(Check):
    name = "extreme"
    description = "no inf/NaN in outputs or gradients at large and tiny input magnitudes where the reference is finite"
    options = {"dtypes": None}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to scale"
        return None

    def run(self, context):
        case = context.case
        dtypes, explicit = check_dtypes(case, context.device)
        if not dtypes:
            pytest.skip("dtypes= on the marker declares no dtype below float64 to check")
        refused = case.reference is None and next(filter(None, (float64_plan(context, s) for s in case.samples)), None)
        if refused:
            pytest.skip(f"{refused.reason}: without reference= there is no float64 truth for extreme inputs")
        unsupported = []
        for dtype in dtypes:
            try:
                for where, magnitude in magnitudes(dtype):
                    for index, sample in context.samples():
                        _check_sample(context, cast_sample(sample, dtype, magnitude), dtype, where, magnitude)
            except OpRaised as raised:
                if explicit or not unsupported_dtype(raised):
                    if isinstance(raised, ReferenceRaised):
                        context.fail_reference_raised(raised)
                    raise
                unsupported.append(dtype_label(dtype))
        if unsupported and len(unsupported) == len(dtypes):
            pytest.skip(f"the op has no kernel for {', '.join(unsupported)} on {context.device}")


def _check_sample(context, scaled, dtype, where, magnitude):
    case = context.case
    got, cotangents = forward_and_backward(context, scaled, dtype)
    if case.reference is not None:
        expected, _ = forward_and_backward(context, scaled, dtype, cotangents, fn=case.reference)
        truth, fits = f"the reference in {dtype_label(dtype)}", None
    else:
        expected, _ = forward_and_backward(context, scaled, torch.float64, cotangents)
        truth, fits = "the op in float64", torch.finfo(dtype).max
    for pair in paired_tensors(expected, got):
        e, g = pair.expected.cpu().to(torch.float64), pair.got.cpu().to(torch.float64)
        demanded = e.isfinite() if fits is None else e.isfinite() & (e.abs() <= fits)
        bad = demanded & ~g.isfinite()
        if not bool(bad.any()):
            continue
        index = tuple(int(i) for i in bad.nonzero()[0])
        value = float(g[index])
        context.fail(
            f"{pair.what} is {'NaN' if math.isnan(value) else 'inf'} in {dtype_label(dtype)} for inputs scaled to "
            f"max |x| = {fmt(magnitude)}, where {truth} is finite",
            dtype=dtype_label(dtype), worst=f"{pair.label}{fmt_index(index)}: {truth} gives "
                                            f"{fmt(float(e[index]))}, the op {fmt(value)}",
            error=f"{int(bad.sum())} of {bad.numel()} elements are inf/NaN where {truth} is finite",
            details=[f"magnitude {where}: every floating input scaled so its largest |element| is {fmt(magnitude)}"],
            hint=_hint(where, "argument" in pair.fields, dtype), **pair.fields)


def _hint(where, in_gradient, dtype):
    if where.startswith("tiny"):
        hint = ("an intermediate underflows to 0 and is then divided by or logged (a norm or variance of tiny "
                "inputs): add an eps, or rescale before squaring")
    else:
        hint = (f"an intermediate overflows {dtype_label(dtype)} (max {fmt(torch.finfo(dtype).max)}): exp of a "
                "large input or a big product; subtract the max before exp (as softmax and logsumexp do) "
                "or rescale")
    if in_gradient:
        hint += "; the outputs are finite, so look at backward (a saved inf, or 1/x of an underflowed value)"
    return hint


check = Extreme()
