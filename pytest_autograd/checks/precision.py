"""precision: low-precision runs against a float64 ground truth, outputs and gradients.

A float32 path that quietly rounds through 16 bits (a stray ``.half()``, a
bfloat16 matmul, TF32) still passes every float64 check. Each sample is
rounded once to the low dtype; a float64 run on exactly those values is the
truth: the reference's when there is one, else the op's own. With
``reference=``, the op may be at most ``precision_k`` times as wrong as the
reference in the same dtype (plus a few ulps): ops that are imprecise only
as much as their reference pass. Without one, the normwise error must stay
within a per-dtype tolerance.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._loci import precision_locus
from pytest_autograd.checks._transforms import (
    HALF_DTYPES,
    ReferenceRaised,
    cast_sample,
    check_dtypes,
    forward_and_backward,
    normwise_error,
    paired_tensors,
    unsupported_dtype,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import OpRaised, has_floating_input
from pytest_autograd.engine.outcomes import UsageProblem, skip
from pytest_autograd.results.compare import dtype_label, fmt
from pytest_autograd.results.evidence import Evidence

FLOOR_ULPS = 8  # the budget's floor, in units of the dtype's eps
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


class Precision(Check):
    name = "precision"
    description = ("outputs and gradients in float32 (and float16/bfloat16 on CUDA) against float64; "
                   "with reference=, within precision_k x the reference's own error")
    options = {"dtypes": None, "precision_k": 2.0, "precision_tol": None}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to run in low precision"
        return None

    def run(self, context):
        case = context.case
        dtypes, explicit = check_dtypes(case, context.device)
        if not dtypes:
            skip("dtypes= on the marker declares no dtype below float64 to check")
        k = _number(case.option("precision_k", 2.0), "precision_k")
        unsupported = []
        refused = None  # the op cannot run in float64: only the reference's float64 run is a truth
        for dtype in dtypes:
            for index, sample in context.samples():
                refused = refused or float64_plan(context, sample)
                if refused is not None and case.reference is None:
                    skip(f"{refused.reason}: without reference= there is no float64 truth to measure its "
                                "precision against")
                low = cast_sample(sample, dtype)
                try:
                    op_low, cotangents = forward_and_backward(context, low, dtype)
                    ref_low = None
                    if case.reference is not None:
                        ref_low, _ = forward_and_backward(context, low, dtype, cotangents, fn=case.reference)
                except OpRaised as raised:
                    if not explicit and unsupported_dtype(raised):
                        unsupported.append(dtype_label(dtype))
                        break
                    if isinstance(raised, ReferenceRaised):
                        context.fail_reference_raised(raised)
                    raise
                op_truth = None if refused else forward_and_backward(context, low, torch.float64, cotangents)[0]
                ref_truth = None
                if ref_low is None:
                    violations = _against_tolerance(case, dtype, op_truth, op_low)
                else:
                    try:
                        ref_truth, _ = forward_and_backward(context, low, torch.float64, cotangents,
                                                            fn=case.reference)
                    except ReferenceRaised as raised:
                        context.fail_reference_raised(raised)
                    violations = _against_reference(dtype, k, ref_truth, op_low, ref_low)
                if violations:
                    _report(context, dtype, k, violations, op_truth, ref_truth, precision_locus(
                        context, low, dtype, violations, cotangents, k, floor(dtype)))
        if unsupported and len(unsupported) == len(dtypes):
            skip(f"the op has no kernel for {', '.join(unsupported)} on {context.device}")


def floor(dtype):
    return FLOOR_ULPS * torch.finfo(dtype).eps


def tolerance(case, dtype):
    wanted = case.option("precision_tol")
    if isinstance(wanted, dict):
        wanted = wanted.get(dtype_label(dtype), wanted.get(dtype))
    return _number(wanted, "precision_tol") if wanted is not None else TOLERANCES.get(dtype, 1e-5)


def _number(value, option):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UsageProblem(f"{option}= must be a non-negative number (precision_tol= may also be a dict "
                           f"dtype name -> number), got {value!r}.")
    return float(value)


@dataclass
class Violation:
    pair: object  # the _transforms.Pair over budget
    error: object  # the op's normwise Error
    ref_error: object  # the reference's Error, None without a reference
    budget: float

    @property
    def ratio(self):
        return self.error.value / self.budget if self.budget > 0 else math.inf


def _against_tolerance(case, dtype, truth, got):
    tol = tolerance(case, dtype)
    found = []
    for pair in paired_tensors(truth, got):
        error = normwise_error(pair.expected, pair.got)
        if error.value > tol:
            found.append(Violation(pair, error, None, tol))
    return found


def _against_reference(dtype, k, truth, op_low, ref_low):
    found = []
    ref_errors = {pair.label: normwise_error(pair.expected, pair.got) for pair in paired_tensors(truth, ref_low)}
    for pair in paired_tensors(truth, op_low):
        if pair.label not in ref_errors:
            continue
        error = normwise_error(pair.expected, pair.got)
        budget = k * ref_errors[pair.label].value + floor(dtype)
        if error.value > budget:
            found.append(Violation(pair, error, ref_errors[pair.label], budget))
    return found


def _report(context, dtype, k, violations, op_truth, ref_truth, locus=None):
    violations.sort(key=lambda v: -v.ratio)
    worst = violations[0]
    error, ref_error, budget, what = worst.error, worst.ref_error, worst.budget, worst.pair.what
    name = dtype_label(dtype)
    if ref_error is None:
        summary = f"{what} in {name} is off from float64 by {fmt(error.value)}, more than the {name} tolerance"
        line = (f"error {fmt(error.value)} (max abs error / max |float64 value|) > tolerance {fmt(budget)} "
                f"for {name}; without reference= there is no error budget to compare against")
    else:
        summary = (f"{what} in {name}: the op's error {fmt(error.value)} exceeds {fmt(k)} x the reference's "
                   f"error {fmt(ref_error.value)}")
        line = (f"op error {fmt(error.value)}, reference error {fmt(ref_error.value)} (each: max abs error / "
                f"max |float64 value|); budget {fmt(k)} x {fmt(ref_error.value)} + floor {fmt(floor(dtype))} "
                f"= {fmt(budget)}")
    details = [f"also {v.pair.what}: error {fmt(v.error.value)} > {fmt(v.budget)}" for v in violations[1:]]
    if ref_truth is not None and op_truth is not None:
        maths = next((normwise_error(p.expected, p.got).value for p in paired_tensors(ref_truth, op_truth)
                      if p.label == worst.pair.label), 0.0)
        if maths > floor(torch.float32):
            # A maths error is the reference check's (and gradcheck's) to report; failing here too
            # would blame precision for it.
            skip(f"the op differs from the reference even in float64 (by {fmt(maths)} in "
                      f"{worst.pair.label}): a maths error, which the reference check reports; precision is "
                      "judged only once the maths agree")
    evidence = [Evidence.of(worst.pair.label, worst.pair.expected, worst.pair.got)]
    context.fail(summary, dtype=name, worst=error.worst(worst.pair.label), error=line, details=details,
                 hint=_hint(dtype, error.value), evidence=evidence, locus=locus, **worst.pair.fields)


def _hint(dtype, error):
    low, high = 0.1 * torch.finfo(torch.float16).eps, 4 * torch.finfo(torch.bfloat16).eps
    if dtype not in HALF_DTYPES and low <= error <= high:
        return (f"an error the size of 16-bit rounding (eps {fmt(torch.finfo(torch.float16).eps)} in float16, "
                f"{fmt(torch.finfo(torch.bfloat16).eps)} in bfloat16) in a {dtype_label(dtype)} run: something "
                "casts to 16 bits or accumulates in them (.half()/.bfloat16(), autocast, TF32 matmuls on CUDA)")
    return ("the op loses more precision than it should: look for cancellation (subtracting close values), "
            "reductions accumulated in a narrower dtype, or intermediate casts")


check = Precision()
