"""reference: outputs and gradients match ``reference=`` on every device.

Run twice: in float64 (where only the maths can differ) and in the
sample's own dtype (where the op's precision shows). When the second pass
disagrees, both sides are judged against the reference in float64 on the
same rounded inputs: a reference less precise than the op is noted, not
blamed on the op. An op that cannot run in float64 skips the first pass.
"""

import inspect

import torch

from pytest_autograd.checks._float64_support import float64_plan, sample_dtype
from pytest_autograd.checks._pairs import compare_runs
from pytest_autograd.checks._reference_runs import Compared, keep, kept
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks._transforms import Run, rounded_cotangents
from pytest_autograd.checks._reference_precision import reference_is_farther
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.case import op_display_name
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.notes import note
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import dtype_label
from pytest_autograd.results.report import CheckFailure


class Reference(Check):
    name = "reference"
    random_draws_differ = "the reference draws numbers of its own"
    description = "outputs and gradients match reference= in float64 and in the sample's dtype"
    options = {"dtypes": None}  # the dtypes the op supports; without float64 it is judged in the best one

    def applies(self, case, device):
        if case.reference is None:
            return "no reference= on the marker"
        return None

    def run(self, context):
        case = context.case
        for index, sample in enumerate(case.samples):
            _check_signature(case.reference, sample, index)
        drawn = {}  # sample index -> its cotangents, drawn once for both passes
        for dtype in (torch.float64, None):
            for index, sample in context.samples():
                if dtype is torch.float64:
                    plan = float64_plan(context, sample)
                    if plan is not None:
                        note(f"reference: {plan.reason}; compared in {dtype_label(plan.dtype)} only")
                        continue
                    context.dtype = None
                run_dtype = dtype or sample_dtype(context, sample)
                if dtype is None and run_dtype == torch.float64 and kept(context, index, torch.float64) is not None:
                    continue  # a float64 sample: its own dtype is the float64 pass, which agreed
                op_side = context.prepare(sample, dtype=run_dtype)
                ref_side = context.prepare(sample, dtype=run_dtype)
                seed_generators(context.device, context.seed)  # a reference drawing as the op does draws alike
                op_outputs = context.run_op(op_side)
                try:
                    seed_generators(context.device, context.seed)
                    ref_outputs = context.run_op(ref_side, fn=case.reference)
                except OpRaised as raised:
                    if isinstance(raised.error, TypeError):
                        raise UsageProblem(
                            f"reference={op_display_name(case.reference)} cannot be called with sample {index}'s arguments: "
                            f"{raised.error}. The reference must take the same arguments as the op."
                        ) from None
                    context.fail_reference_raised(raised)
                if index not in drawn:
                    drawn[index] = rounded_cotangents(ref_outputs, context.generator, sample_dtype(context, sample))
                try:
                    grads = compare_runs(context, (ref_side, ref_outputs), (op_side, op_outputs),
                                         expected_label="the reference", got_label="the op",
                                         roles=("reference", "op"), cotangents=drawn[index])
                    if grads is not None:
                        keep(context, index, run_dtype, Compared(
                            Run([o.detach() for o in op_outputs], grads[1], list(op_side.names)),
                            Run([o.detach() for o in ref_outputs], grads[0], list(ref_side.names)), drawn[index]))
                except CheckFailure as failure:
                    low = run_dtype
                    values_differ = failure.report.error is not None  # not a dtype, shape or count mismatch
                    agreed = _agrees_without_ties(context, sample, run_dtype) if values_differ else None
                    if agreed is not None:
                        context.note(agreed)
                        continue
                    verdict = None if dtype is torch.float64 or low in (None, torch.float64) or not values_differ \
                        else reference_is_farther(context, sample, low)
                    if verdict is None:
                        raise
                    note(verdict.note(low))
            context.dtype = None


def _agrees_without_ties(context, sample, run_dtype):
    """A note when op and reference differ on a sample with ties but agree once the ties are moved apart.

    At a tie a selection op may pick any of the tied elements (top-k's
    indices, which element max's gradient goes to): an op and a reference
    that break ties differently are both right. None when the sample has no
    ties or they still differ without them.
    """
    from pytest_autograd.checks._ties import tie_free_sample

    found = tie_free_sample(context.case, sample, context.generator)
    if found is None:
        return None
    moved, ties, names = found
    try:
        op_side = context.prepare(moved, dtype=run_dtype)
        ref_side = context.prepare(moved, dtype=run_dtype)
        compare_runs(context, (ref_side, context.run_op(ref_side, fn=context.case.reference)),
                     (op_side, context.run_op(op_side)), expected_label="the reference", got_label="the op")
    except (CheckFailure, OpRaised):
        return None
    return (f"reference: the op and the reference differ only at ties "
            f"({ties.describe(names)}): each picks its own among tied elements; with the ties moved apart "
            "they agree; noted, not failed")


def _check_signature(reference, sample, index):
    try:
        signature = inspect.signature(reference)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*sample.args, **sample.kwargs)
    except TypeError as error:
        raise UsageProblem(
            f"reference={op_display_name(reference)}{signature} does not accept sample {index}'s "
            f"{len(sample.args)} positional argument(s){' and keywords ' + ', '.join(sample.kwargs) if sample.kwargs else ''}: "
            f"{error}. The reference must take the same arguments as the op."
        ) from None


check = Reference()
