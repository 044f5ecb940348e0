"""precision: low-precision runs against a float64 ground truth, outputs and gradients.

A float32 path that quietly rounds through 16 bits (a stray ``.half()``, a
bfloat16 matmul, TF32) still passes every float64 check. Each sample is
rounded once to the low dtype; a float64 run on exactly those values is the
truth: the reference's when there is one, else the op's own. With
``reference=``, the op may be at most ``precision_k`` times as wrong as the
reference in the same dtype (plus a few ulps): ops that are imprecise only
as much as their reference pass. Without one, the normwise error must stay
within a per-dtype tolerance.

In float16 and bfloat16 the reference in the same dtype is the yardstick,
as in flash-attention's tests: every output and gradient may be at most
``LOW_PRECISION_K`` (3) times as far from float64 as the reference's, plus
one ulp, no fixed 16-bit tolerance (8 bfloat16 ulps is 6%, which hides a
reduction accumulated in bfloat16). Reductions long enough to show such an
accumulator are run too: a variant of each sample with its rows repeated to
``LONG_ROWS`` (see ``_long_reduction``).

The dtypes: float32, float16/bfloat16 on CUDA, and the samples' own 16-bit
dtype anywhere; a dtype the op refuses by design (it raises naming a dtype
that the samples are not in and ``dtypes=`` does not declare) is noted,
not failed.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._loci import precision_locus
from pytest_autograd.checks._long_reduction import LONG_ROWS, long_reduction_variants
from pytest_autograd.checks._transforms import (
    HALF_DTYPES,
    DtypeRefusals,
    ReferenceRaised,
    cast_sample,
    check_dtypes,
    forward_and_backward,
    normwise_error,
    paired_tensors,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import OpRaised, has_floating_input
from pytest_autograd.engine.outcomes import UsageProblem, skip
from pytest_autograd.results.compare import dtype_label, fmt
from pytest_autograd.results.evidence import Evidence

FLOOR_ULPS = 8  # the budget's floor, in units of the dtype's eps
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# float16/bfloat16 against the reference in the same dtype. flash-attention's tests allow 2x the reference's
# error; 3x leaves room for a correct kernel that rounds one more intermediate to the dtype than the reference
# does (P stored in bfloat16 before P @ V), while a reduction accumulated in the dtype costs 5-20x. The floor,
# one ulp, covers a reference that happens to be exact where the op rounds its result once or twice.
LOW_PRECISION_K = 3.0
LOW_PRECISION_FLOOR_ULPS = 1
FORMULA_ERROR = 0.1  # a normwise error this large on the sample itself (not a long reduction) is not rounding


class Precision(Check):
    name = "precision"
    random_draws_differ = "a float32 run and a float64 one draw different numbers from one seed"
    description = ("outputs and gradients in float32 (and float16/bfloat16 on CUDA or in the samples' dtype) "
                   "against float64; with reference=, within precision_k x the reference's own error")
    options = {"dtypes": None, "precision_k": None, "precision_tol": None}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to run in low precision"
        return None

    def run(self, context):
        case = context.case
        dtypes, explicit = check_dtypes(case, context.device)
        if not dtypes:
            skip("dtypes= on the marker declares no dtype below float64 to check")
        refusals = DtypeRefusals(self.name, dtypes, explicit, case)
        refused = None  # the op cannot run in float64: only the reference's float64 run is a truth
        for dtype in dtypes:
            budget = Budget.of(case, dtype)
            long_pending = budget.same_dtype and case.reference is not None  # one long variant per dtype
            for index, sample in context.samples():
                refused = refused or float64_plan(context, sample)
                if refused is not None and case.reference is None:
                    skip(f"{refused.reason}: without reference= there is no float64 truth to measure its "
                                "precision against")
                try:
                    _judge_or_without_ties(context, sample, dtype, budget, refused)
                except OpRaised as raised:
                    if refusals.refused(raised, dtype):
                        break
                    if isinstance(raised, ReferenceRaised):
                        context.fail_reference_raised(raised)
                    raise
                if long_pending:
                    long_pending = not _judge_long_reductions(context, sample, dtype, budget, refused)
        context.sample_index = None
        refusals.finish(context)


@dataclass
class Budget:
    """How far from float64 the op may be in one dtype: ``k`` x the reference's error + ``floor``."""

    k: float
    floor: float
    same_dtype: bool  # the 16-bit rule: judged by the reference in the same dtype, no fixed tolerance

    @classmethod
    def of(cls, case, dtype):
        given = case.option("precision_k")
        if dtype in HALF_DTYPES:
            k = LOW_PRECISION_K if given is None else _number(given, "precision_k")
            return cls(k, LOW_PRECISION_FLOOR_ULPS * torch.finfo(dtype).eps, True)
        return cls(2.0 if given is None else _number(given, "precision_k"), floor(dtype), False)


def _judge(context, sample, dtype, budget, refused, variant=None):
    """Run op and reference in ``dtype`` and the truth in float64 on the same rounded ``sample``; fail when over
    budget. Raises OpRaised when the op (or ReferenceRaised when the reference) raises in ``dtype``."""
    low = cast_sample(sample, dtype)
    passes = None if variant is not None else _reference_passes(context, sample, dtype)
    if passes is not None:  # the reference check made these very runs, and they agreed
        in_dtype, in_float64 = passes
        op_low, ref_low, ref_truth, cotangents = in_dtype.op, in_dtype.reference, in_float64.reference, \
            in_dtype.cotangents
        violations = _against_reference(budget, ref_truth, op_low, ref_low)
        truth = in_float64.op if violations and not refused else None
    else:
        op_low, ref_low, ref_truth, truth, violations, cotangents = _runs(context, low, dtype, budget, refused)
    if violations:
        locus = precision_locus(context, low, dtype, violations, cotangents, budget.k, budget.floor)
        _report(context, dtype, budget, violations, truth, ref_truth, variant, locus)


def _runs(context, low, dtype, budget, refused):
    """``(op_low, ref_low, ref_truth, op_truth, violations, cotangents)``: op (and reference) in ``dtype`` and the
    truth in float64 on the rounded sample ``low``, run here."""
    case = context.case
    op_low, cotangents = forward_and_backward(context, low, dtype)
    ref_low = None
    if case.reference is not None:
        ref_low, _ = forward_and_backward(context, low, dtype, cotangents, fn=case.reference)

    def op_truth():
        return None if refused else forward_and_backward(context, low, torch.float64, cotangents)[0]

    if ref_low is None:
        truth = op_truth()
        return op_low, None, None, truth, _against_tolerance(case, dtype, truth, op_low), cotangents
    try:
        ref_truth, _ = forward_and_backward(context, low, torch.float64, cotangents, fn=case.reference)
    except ReferenceRaised as raised:
        context.fail_reference_raised(raised)
    violations = _against_reference(budget, ref_truth, op_low, ref_low)
    truth = op_truth() if violations else None  # the op's own float64 run only tells a failure's cause
    return op_low, ref_low, ref_truth, truth, violations, cotangents


def _reference_passes(context, sample, dtype):
    """(the pass in ``dtype``, the pass in float64) the reference check made on ``sample`` and found agreeing,
    when ``sample`` is given in ``dtype`` (so its float64 pass ran on exactly the rounded values); else None."""
    from pytest_autograd.checks._reference_runs import kept
    from pytest_autograd.engine.execution import floating_tensors

    index = context.sample_index
    if context.case.reference is None or index is None or sample is not context.case.samples[index]:
        return None
    if any(value.dtype != dtype for value in floating_tensors(sample)):
        return None
    in_dtype, in_float64 = kept(context, index, dtype), kept(context, index, torch.float64)
    if in_dtype is None or in_float64 is None:
        return None
    if any(out.is_floating_point() and out.dtype != dtype for out in in_dtype.op.outputs):
        return None  # cotangents are rounded through the sample's dtype: the outputs must be in it
    return in_dtype, in_float64


class _MathsDiffer(Exception):
    """The op differs from the reference even in float64: not precision's to judge."""


def _judge_or_without_ties(context, sample, dtype, budget, refused):
    """``_judge``; where op and reference differ even in float64 on a sample with ties (each selecting its own
    tied element), the sample with its ties moved apart is judged instead. Skips on a maths difference."""
    from pytest_autograd.checks._ties import tie_free_sample

    try:
        _judge(context, sample, dtype, budget, refused)
        return
    except _MathsDiffer as differ:
        moved = tie_free_sample(context.case, sample, context.generator)
        if moved is None:
            skip(str(differ))
    try:
        _judge(context, moved[0], dtype, budget, refused)
    except _MathsDiffer as differ:
        skip(str(differ))


def _judge_long_reductions(context, sample, dtype, budget, refused):
    """Judge the sample's long-reduction variant (its rows repeated) the same way; True when one was judged.

    One variant per dtype is enough: an accumulator's dtype does not depend
    on the sample. The op not taking one is noted, not failed.
    """
    tried = []
    for variant in long_reduction_variants(context.case, sample):
        try:
            _judge(context, variant.sample, dtype, budget, refused, variant)
            return True
        except _MathsDiffer as differ:
            skip(str(differ))
        except OpRaised as raised:  # the op (or the reference) cannot take the larger sample: its own business
            who = "reference" if isinstance(raised, ReferenceRaised) else "op"
            tried.append(f"the {who} raised {type(raised.error).__name__} on {variant.description}")
    if tried:
        context.note(f"precision: no long-reduction variant ({LONG_ROWS} rows) of this sample could be run in "
                     f"{dtype_label(dtype)}: {'; '.join(tried)}; judged on the sample itself only")
    return False


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


def _against_reference(budget, truth, op_low, ref_low):
    found = []
    ref_errors = {pair.label: normwise_error(pair.expected, pair.got) for pair in paired_tensors(truth, ref_low)}
    for pair in paired_tensors(truth, op_low):
        if pair.label not in ref_errors:
            continue
        error = normwise_error(pair.expected, pair.got)
        allowed = budget.k * ref_errors[pair.label].value + budget.floor
        if error.value > allowed:
            found.append(Violation(pair, error, ref_errors[pair.label], allowed))
    return found


def _report(context, dtype, budget, violations, op_truth, ref_truth, variant=None, locus=None):
    violations.sort(key=lambda v: -v.ratio)
    worst = violations[0]
    error, ref_error, allowed, what = worst.error, worst.ref_error, worst.budget, worst.pair.what
    name, k = dtype_label(dtype), budget.k
    if ref_error is None:
        summary = f"{what} in {name} is off from float64 by {fmt(error.value)}, more than the {name} tolerance"
        line = (f"error {fmt(error.value)} (max abs error / max |float64 value|) > tolerance {fmt(allowed)} "
                f"for {name}; without reference= there is no error budget to compare against")
    elif budget.same_dtype:
        summary = (f"{what} in {name}: error {fmt(error.value)}, the reference in {name} {fmt(ref_error.value)}: "
                   f"{_times(error.value, ref_error.value)}, budget {fmt(k)}x")
        line = (f"op error {fmt(error.value)}, reference error {fmt(ref_error.value)} (each: max abs error / "
                f"max |float64 value|, against the reference in float64 on the same rounded inputs); budget "
                f"{fmt(k)} x {fmt(ref_error.value)} + {LOW_PRECISION_FLOOR_ULPS} ulp {fmt(budget.floor)} = "
                f"{fmt(allowed)}")
    else:
        summary = (f"{what} in {name}: the op's error {fmt(error.value)} exceeds {fmt(k)} x the reference's "
                   f"error {fmt(ref_error.value)}")
        line = (f"op error {fmt(error.value)}, reference error {fmt(ref_error.value)} (each: max abs error / "
                f"max |float64 value|); budget {fmt(k)} x {fmt(ref_error.value)} + floor {fmt(budget.floor)} "
                f"= {fmt(allowed)}")
    details = [f"on the long-reduction variant of sample {context.sample_index}: {variant.description}"] \
        if variant is not None else []
    details += [f"also {v.pair.what}: error {fmt(v.error.value)} > {fmt(v.budget)}" for v in violations[1:]]
    if ref_truth is not None and op_truth is not None:
        maths = next((normwise_error(p.expected, p.got).value for p in paired_tensors(ref_truth, op_truth)
                      if p.label == worst.pair.label), 0.0)
        if maths > floor(torch.float32):
            # A maths error is the reference check's (and gradcheck's) to report; failing here too
            # would blame precision for it.
            raise _MathsDiffer(f"the op differs from the reference even in float64 (by {fmt(maths)} in "
                               f"{worst.pair.label}): a maths error, which the reference check reports; precision "
                               "is judged only once the maths agree")
    evidence = [Evidence.of(worst.pair.label, worst.pair.expected, worst.pair.got)]
    if variant is None and error.value > FORMULA_ERROR:
        hint = (f"an error of {fmt(error.value)} is far beyond rounding in {name} on the sample itself: a wrong "
                "formula is more likely than lost precision (the reference and derivative checks judge the formula)")
    elif budget.same_dtype and ref_error is not None:
        hint = _same_dtype_hint(dtype, worst.pair)
    else:
        hint = _hint(dtype, error.value)
    context.fail(summary, dtype=name, worst=error.worst(worst.pair.label), error=line, details=details,
                 hint=hint, evidence=evidence, locus=locus, **worst.pair.fields)


def _times(error, ref_error):
    return f"{error / ref_error:.3g}x" if ref_error > 0 else "the reference is exact"


def _same_dtype_hint(dtype, pair):
    name = dtype_label(dtype)
    if "argument" in pair.fields:
        return (f"a reduction accumulated in {name}: a gradient summed over many rows (a weight's or a bias's) "
                f"in {name} partial sums or an accumulator buffer allocated in the inputs' dtype loses precision "
                f"with every term; accumulate in float32 and round to {name} once at the end")
    return (f"a reduction accumulated in {name}, or intermediates rounded to {name} more often than the reference "
            f"does: accumulate in float32 and round to {name} once at the end")


def _hint(dtype, error):
    low, high = 0.1 * torch.finfo(torch.float16).eps, 4 * torch.finfo(torch.bfloat16).eps
    if dtype not in HALF_DTYPES and low <= error <= high:
        return (f"an error the size of 16-bit rounding (eps {fmt(torch.finfo(torch.float16).eps)} in float16, "
                f"{fmt(torch.finfo(torch.bfloat16).eps)} in bfloat16) in a {dtype_label(dtype)} run: something "
                "casts to 16 bits or accumulates in them (.half()/.bfloat16(), autocast, TF32 matmuls on CUDA)")
    return ("the op loses more precision than it should: look for cancellation (subtracting close values), "
            "reductions accumulated in a narrower dtype, or intermediate casts")


check = Precision()
