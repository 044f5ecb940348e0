"""reference: outputs and gradients match ``reference=`` on every device.

Run twice: in float64 (where only the maths can differ) and in the
sample's own dtype (where the op's precision shows).
"""

import inspect

import torch

from pytest_autograd.case import UsageProblem, op_display_name
from pytest_autograd.checks._pairs import compare_runs
from pytest_autograd.checks.base import Check
from pytest_autograd.execution import OpRaised


class Reference(Check):
    name = "reference"
    description = "outputs and gradients match reference= in float64 and in the sample's dtype"

    def applies(self, case, device):
        if case.reference is None:
            return "no reference= on the marker"
        return None

    def run(self, context):
        case = context.case
        for index, sample in enumerate(case.samples):
            _check_signature(case.reference, sample, index)
        for dtype in (torch.float64, None):
            for index, sample in context.samples():
                op_side = context.prepare(sample, dtype=dtype)
                ref_side = context.prepare(sample, dtype=dtype)
                op_outputs = context.run_op(op_side)
                try:
                    ref_outputs = context.run_op(ref_side, fn=case.reference)
                except OpRaised as raised:
                    if isinstance(raised.error, TypeError):
                        raise UsageProblem(
                            f"reference={op_display_name(case.reference)} cannot be called with sample {index}'s arguments: "
                            f"{raised.error}. The reference must take the same arguments as the op."
                        ) from None
                    context.fail_reference_raised(raised)
                compare_runs(context, (ref_side, ref_outputs), (op_side, op_outputs),
                             expected_label="the reference", got_label="the op")
            context.dtype = None


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
