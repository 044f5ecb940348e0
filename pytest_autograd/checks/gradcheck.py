"""gradcheck: analytical vs numerical first derivatives, in float64.

An op that cannot run in float64 is judged in its own dtype instead (see
``_low_precision``), and the pass note names the strategy.

Small inputs get the full Jacobian; large ones targeted probes (see
``_derivatives``), so a 200k-element op is checked in seconds without
building a Jacobian.
"""

from pytest_autograd.checks._derivatives import (
    EXHAUSTIVE_LIMIT,
    KinkNotes,
    find_derivative_error,
    marker_tolerances,
)
from pytest_autograd.checks._first_order import plan_and_first_order
from pytest_autograd.checks._float32_blind import plan_after_float64_pass
from pytest_autograd.checks._numerical import Precomputed
from pytest_autograd.checks._hints import derivative_details, derivative_hint
from pytest_autograd.checks._loci import derivative_locus
from pytest_autograd.checks._low_precision import judge_first_derivatives, skip_unjudged
from pytest_autograd.checks._same_draws import random_draws_hint
from pytest_autograd.checks._surrogate import (
    OPTION,
    SURROGATE_HINT,
    looks_like_surrogate,
    surrogate_reason,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.distributed import exhaustive_limit
from pytest_autograd.engine.execution import (
    constants_only_reason,
    declared_nondifferentiable,
    has_floating_input,
    output_label,
)


class GradCheck(Check):
    name = "gradcheck"
    description = "analytical vs numerical first derivatives in float64, for every floating argument"
    options = {"dtypes": None, **OPTION}  # dtypes: those the op supports; without float64 it is judged in the best one

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return constants_only_reason(case) or surrogate_reason(case, self.name)

    def run(self, context):
        notes, unjudged = KinkNotes(), []
        for index, sample in context.samples():
            plan, shared = plan_and_first_order(context, index, sample, second=second_derivatives_follow(context))
            if plan is not None:
                judge_first_derivatives(context, sample, plan, unjudged)
                continue
            if shared is None:  # no differentiable argument in this sample
                continue
            prepared, outputs = shared.prepared, shared.outputs
            output_names = [output_label(k, len(outputs)) for k in range(len(outputs))]
            if not any(out.is_floating_point() for out in outputs):
                continue

            def fn(leaves):
                return context.run_op(prepared, leaves)  # noqa: B023

            fn.on_fresh = lambda leaves: context.run_op(prepared, leaves, clone_leaves=False)  # noqa: B023

            declared = declared_nondifferentiable(context.case, outputs)
            for k in declared:
                context.note(f"{output_names[k]} is declared non-differentiable (ctx.mark_non_differentiable): "
                             "its gradient is not judged")
            noted_before = len(notes.lines)
            error = find_derivative_error(
                fn, prepared.leaves, prepared.names, output_names, context.generator,
                notes=notes, outputs=outputs, nondifferentiable=declared, precomputed=_precomputed(context, shared),
                draws=shared.draws, exhaustive_limit=exhaustive_limit(context.case, EXHAUSTIVE_LIMIT),
                **marker_tolerances(context.case),
            )
            if error is None:
                zero = any(g is not None and g.numel() and not bool(g.detach().ne(0).any()) for g in shared.grads)
                plan = plan_after_float64_pass(context, sample, notes, noted_before, zero_gradient=zero)
                if plan is not None:
                    judge_first_derivatives(context, sample, plan, unjudged)
            notes.flush(context)
            if error is not None:
                context.fail(
                    f"gradient of {error.output} w.r.t. `{error.argument}` does not match the numerical derivative",
                    output=error.output, argument=error.argument, worst=error.worst(),
                    error=error.error_line(), details=derivative_details(error),
                    evidence=error.evidence + [e for other in error.others for e in other.evidence],
                    hint=(SURROGATE_HINT.format(name=error.argument) if looks_like_surrogate(error) else
                          _float32_hint(context, sample) or random_draws_hint(context, sample)
                          or derivative_hint(error, has_backward=context.case.is_function)),
                    locus=derivative_locus(error, context, prepared, order=1),
                    also=[{"argument": other.argument, "output": other.output, "worst": other.worst(),
                           "locus": derivative_locus(other, context, prepared, order=1)} for other in error.others],
                )
        skip_unjudged(context, self.name, unjudged)


check = GradCheck()


def second_derivatives_follow(context):
    """Whether gradgradcheck judges this case on this device after gradcheck (its share of the work is then
    done with gradcheck's): the run names it, and it applies."""
    from pytest_autograd.checks.gradgradcheck import check as gradgradcheck

    run = context.case.run_options
    return run is not None and gradgradcheck.name in (run.checks or ()) and \
        gradgradcheck.applies(context.case, context.device) is None


def _precomputed(context, shared):
    """gradcheck's view of the sample's FirstOrder: its cotangents and gradients (copies: a memory-saving backward
    returns the buffers its next run overwrites) and its probes' forwards, for the outputs it judges (floating, not
    declared non-differentiable: those the FirstOrder drew a cotangent for)."""
    judged = list(shared.cotangents)

    def spent():
        shared.spent = True

    return Precomputed(
        cotangents=[shared.cotangents[k].detach() for k in judged],
        analytical=[g.detach().clone() for g in shared.grads],
        directions=shared.directions, eps=shared.eps, on_spent=spent,
        at=lambda k, sign: [shared.forward_at(k, sign)[j] for j in judged],
    )


def _float32_hint(context, sample):
    """The hint for an op that computes in float32 whatever it is given (``x.float()`` ... ``.to(x.dtype)``):
    its float64 finite differences see float32 rounding, not its derivative. None for any other op."""
    from pytest_autograd.checks._edges import differentiated_slots
    from pytest_autograd.engine.model_probes import float32_compute_reason

    reason = float32_compute_reason(context.case.op, sample, set(differentiated_slots(context.case, sample)))
    if reason is None or "backward" in reason:
        return None
    return (f"the op computes in float32 for float64 inputs ({reason.split(': ')[0]}), so float64 finite "
            "differences measure float32 rounding, not its derivative: if float32 is what the kernel supports, "
            "declare it on the marker, dtypes=(torch.float32,), and it is judged in float32 (the grad_metadata "
            "check reports the silent float32 computation otherwise)")

