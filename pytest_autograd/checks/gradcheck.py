"""gradcheck: analytical vs numerical first derivatives, in float64.

Small inputs get the full Jacobian; large ones targeted probes (see
``_derivatives``), so a 200k-element op is checked in seconds without
building a Jacobian.
"""

import torch

from pytest_autograd.checks._derivatives import (
    KinkNotes,
    below_float64,
    find_derivative_error,
    low_precision_reason,
    marker_tolerances,
)
from pytest_autograd.checks._hints import derivative_hint
from pytest_autograd.checks.base import Check
from pytest_autograd.execution import has_floating_input, output_label


class GradCheck(Check):
    name = "gradcheck"
    description = "analytical vs numerical first derivatives in float64, for every floating argument"

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return None

    def run(self, context):
        low_precision = checked = 0
        notes = KinkNotes()
        for index, sample in context.samples():
            prepared = context.prepare(sample, dtype=torch.float64)
            if not prepared.leaves:
                continue
            outputs = context.run_op(prepared)
            output_names = [output_label(k, len(outputs)) for k in range(len(outputs))]
            if not any(out.is_floating_point() for out in outputs):
                continue
            lower = below_float64(outputs)
            if lower:
                low_precision = lower
                continue
            checked += 1

            def fn(leaves):
                return context.run_op(prepared, leaves)

            error = find_derivative_error(
                fn, prepared.leaves, prepared.names, output_names, context.generator,
                notes=notes, outputs=outputs, **marker_tolerances(context.case),
            )
            _record(context, notes)
            if error is not None:
                context.fail(
                    f"gradient of {error.output} w.r.t. `{error.argument}` does not match the numerical derivative",
                    output=error.output, argument=error.argument, worst=error.worst(),
                    error=error.error_line(), hint=derivative_hint(error, has_backward=context.case.is_function),
                )
        if low_precision and not checked:
            from pytest import skip

            skip(low_precision_reason(low_precision))


def _record(context, notes):
    """Kinks of this sample become the item's notes (seen by the user, never failed)."""
    for line in notes.lines:
        context.note(line)
    notes.lines.clear()


check = GradCheck()
