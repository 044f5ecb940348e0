"""Derivative checks for ops that cannot run in float64.

Most CUDA and Triton kernels accept only float32 (or 16-bit) inputs, raise
on float64, or compute in float32 whatever they get. Finite differences with
float64 constants then measure rounding, not the derivative. Such ops are
still judged, in the most precise dtype they accept, by one of two
strategies, and the strategy is named in the pass note or the failure:

* with ``reference=``: the op's gradients in its dtype against the
  reference's gradients in float64 on exactly the same rounded inputs and
  cotangents, within the precision check's budget (``precision_k`` times
  the reference's own error in that dtype, plus a few ulps);
* without one: central differences in the op's dtype with a measured
  tolerance (``_measured_differences``).

Which ops need this, and in which dtype, is ``_float64_support``'s job.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.checks._measured_differences import find_low_precision_error
from pytest_autograd.engine.draws import normal
from pytest_autograd.engine.execution import OpRaised, as_dense, differentiable_indices
from pytest_autograd.engine.outcomes import raised_by_op
from pytest_autograd.results.compare import dtype_label, fmt, fmt_index

# ---------------------------------------------------------------------------
# With a reference: gradients against the reference's float64 gradients
# ---------------------------------------------------------------------------

@dataclass
class Disagreement:
    """One gradient over the error budget, in the reference strategy."""

    label: str
    argument: str
    error: object  # the op's normwise Error against the float64 truth
    ref_error: float  # the reference's own error in the low dtype (None when it cannot run there)
    budget: float

    def worst(self):
        e = self.error
        return f"{self.label}{fmt_index(e.index)}: expected {fmt(e.expected)} (reference, float64), got {fmt(e.got)}"

    def error_line(self):
        from pytest_autograd.checks.precision import FLOOR_ULPS

        if self.ref_error is None:
            return f"normwise error {fmt(self.error.value)} > tolerance {fmt(self.budget)}"
        return (f"normwise error {fmt(self.error.value)} > budget {fmt(self.budget)} (precision_k x the reference's "
                f"own error {fmt(self.ref_error)} in this dtype, plus {FLOOR_ULPS} ulps)")


def against_reference(op_low, ref_truth, ref_low, dtype, k):
    """The worst op gradient (one Run each side) beyond the precision budget, or None."""
    from pytest_autograd.checks._transforms import normwise_error
    from pytest_autograd.checks.precision import floor

    worst = None
    ref_grads = dict(zip(ref_truth.names, ref_truth.grads))
    ref_low_grads = dict(zip(ref_low.names, ref_low.grads)) if ref_low is not None else {}
    for name, got in zip(op_low.names, op_low.grads):
        truth = ref_grads.get(name)
        if truth is None:
            continue
        error = normwise_error(truth, got)
        ref_error = normwise_error(truth, ref_low_grads[name]).value if name in ref_low_grads else None
        budget = (k * ref_error if ref_error is not None else 0.0) + floor(dtype)
        if ref_error is None:
            budget = max(budget, 16 * floor(dtype))
        if error.value > budget and (worst is None or error.value / budget > worst.error.value / worst.budget):
            worst = Disagreement(f"grad {name}", name, error, ref_error, budget)
    return worst


# ---------------------------------------------------------------------------
# The checks' entry points
# ---------------------------------------------------------------------------

def judge_first_derivatives(context, sample, plan, unjudged):
    """gradcheck for an op that cannot run in float64: fails through ``context``, notes on pass; ``unjudged``
    receives the arguments central differences could not judge (see ``skip_unjudged``)."""
    from pytest_autograd.checks._hints import derivative_hint
    from pytest_autograd.checks._surrogate import SURROGATE_HINT, looks_like_surrogate
    from pytest_autograd.engine.notes import note

    case, dtype = context.case, plan.dtype
    details = [f"strategy: {plan.note('gradcheck', case.reference is not None)}"]
    if case.reference is not None:
        op_low, ref_truth, ref_low = _reference_runs(context, sample, dtype)
        worst = against_reference(op_low, ref_truth, ref_low, dtype, _precision_k(case))
        if worst is not None:
            context.fail(f"gradient w.r.t. `{worst.argument}` in {dtype_label(dtype)} does not match the reference's "
                         "float64 gradient", dtype=dtype_label(dtype), argument=worst.argument, worst=worst.worst(),
                         error=worst.error_line(), details=details,
                         hint="the op's backward is wrong for this argument (the reference, run on the same rounded "
                              "inputs in float64, disagrees by more than rounding explains)")
    else:
        prepared = context.prepare(sample, dtype=dtype)
        if prepared.leaves:
            kinks, ties, blind, domain = [], [], [], []
            error = find_low_precision_error(lambda leaves: context.run_op(prepared, leaves), prepared.leaves,
                                             prepared.names, context.generator, dtype, kinks=kinks, ties=ties,
                                             unresolved=blind, domain=domain)
            _note_kinks("gradcheck", kinks)
            for line in domain:
                note(f"gradcheck: {line}")
            for line in ties:
                note(f"gradcheck: {line} (at a tie a selection flips: noted, not failed)")
            if error is not None:
                context.fail(f"gradient of {error.output} w.r.t. `{error.argument}` does not match the numerical "
                             f"derivative in {dtype_label(dtype)}", dtype=dtype_label(dtype), output=error.output,
                             argument=error.argument, worst=error.worst(), error=error.error_line(), details=details,
                             hint=(SURROGATE_HINT.format(name=error.argument) if looks_like_surrogate(error)
                                   else derivative_hint(error, has_backward=case.is_function)))
        unjudged.extend(_where(context, dtype, line) for line in blind)
    context.dtype = None
    note(plan.note("gradcheck", case.reference is not None))


def judge_second_derivatives(context, sample, plan, backward_of, unjudged):
    """gradgradcheck for an op that cannot run in float64 (``unjudged`` as in ``judge_first_derivatives``).

    ``backward_of(prepared, outputs, differentiable)`` returns ``(leaves ->
    first gradients, leaves, names)``, what gradgradcheck differentiates.
    """
    from pytest_autograd.engine.notes import note

    case, dtype = context.case, plan.dtype
    details = [f"strategy: {plan.note('gradgradcheck', case.reference is not None)}"]
    if case.reference is not None:
        worst = _second_order_against_reference(context, sample, dtype)
        if worst is not None:
            context.fail(f"second derivative w.r.t. `{worst.argument}` in {dtype_label(dtype)} does not match the "
                         "reference's float64 one", dtype=dtype_label(dtype), argument=worst.argument,
                         worst=worst.worst(), error=worst.error_line(), details=details,
                         hint="the backward's own gradient is wrong (or not differentiable): check the ops backward "
                              "uses on saved tensors")
    else:
        prepared = context.prepare(sample, dtype=dtype)
        outputs = context.run_op(prepared) if prepared.leaves else []
        differentiable = differentiable_indices(outputs)
        if differentiable:
            fn, leaves, names = backward_of(prepared, outputs, differentiable)
            kinks, blind, domain = [], [], []
            error = find_low_precision_error(fn, leaves, names, context.generator, dtype, needs_grad=True,
                                             kinks=kinks, unresolved=blind, domain=domain)
            _note_kinks("gradgradcheck", kinks)
            for line in domain:
                note(f"gradgradcheck: {line}")
            if error is not None:
                context.fail(f"second derivative of {error.output} w.r.t. `{error.argument}` does not match the "
                             f"numerical one in {dtype_label(dtype)}", dtype=dtype_label(dtype), output=error.output,
                             argument=error.argument, worst=error.worst(), error=error.error_line(), details=details,
                             hint="the backward's own gradient is wrong (or not differentiable): check the ops "
                                  "backward uses on saved tensors")
            unjudged.extend(_where(context, dtype, line) for line in blind)
    context.dtype = None
    note(plan.note("gradgradcheck", case.reference is not None))


def skip_unjudged(context, check, unjudged):
    """Skip the check, after every sample was judged and none failed, when central differences could not judge
    some argument: at every probe, even at smaller steps, their steps disagreed by more than the derivative they
    measured, so a wrong gradient (a zero one too) would have passed. Passing it would vouch for nothing."""
    if not unjudged:
        return
    from pytest_autograd.engine.outcomes import skip

    where = "; ".join(dict.fromkeys(unjudged))
    context.sample_index = None
    skip(f"{check}: central differences cannot judge the gradient w.r.t. {where}: the op's outputs change faster "
         "than the smallest step follows (or are noise of the derivative's own size), so any gradient would pass "
         f"there; the other arguments passed. Give reference= (gradients against its float64 ones on the same "
         f"rounded inputs) or let the op run in float64")


def _where(context, dtype, unresolved):
    name, measured = unresolved
    sample = f"sample {context.sample_index}, " if context.sample_index is not None else ""
    return f"`{name}` ({sample}{dtype_label(dtype)}; {measured})"


def _note_kinks(check, kinks):
    if kinks:
        from pytest_autograd.engine.notes import note

        note(f"{check}: at {', '.join(kinks[:3])}{' and more' if len(kinks) > 3 else ''} the one-sided differences "
             "differ (a kink) and the analytical value is one of them or between them: noted, not failed")


def _precision_k(case):
    from pytest_autograd.checks.precision import _number

    return _number(case.option("precision_k", 2.0), "precision_k")


def _reference_runs(context, sample, dtype):
    """(op in dtype, reference in float64, reference in dtype or None) on the same rounded inputs and cotangents."""
    from pytest_autograd.checks._transforms import (
        ReferenceRaised,
        cast_sample,
        forward_and_backward,
    )

    low = cast_sample(sample, dtype)
    op_low, cotangents = forward_and_backward(context, low, dtype)
    try:
        ref_truth, _ = forward_and_backward(context, low, torch.float64, cotangents, fn=context.case.reference)
    except ReferenceRaised as raised:
        context.fail_reference_raised(raised)
    try:
        ref_low, _ = forward_and_backward(context, low, dtype, cotangents, fn=context.case.reference)
    except ReferenceRaised:
        ref_low = None
    return op_low, ref_truth, ref_low


def _second_order_against_reference(context, sample, dtype):
    """Second-order vjps of the op in ``dtype`` vs the reference's in float64, on the same rounded values."""
    from pytest_autograd.checks._transforms import ReferenceRaised, Run, cast_sample

    low = cast_sample(sample, dtype)
    draws = {}

    def run(run_dtype, fn):
        prepared = context.prepare(low, dtype=run_dtype)
        outputs = context.run_op(prepared, fn=fn)
        diff = differentiable_indices(outputs)
        if "v" not in draws:
            draws["v"] = [normal(tuple(outputs[k].shape), context.generator)
                          .to(dtype).to(torch.float64) for k in diff]
        cotangents = [v.to(device=outputs[k].device, dtype=outputs[k].dtype).requires_grad_(True)
                      for k, v in zip(diff, draws["v"])]
        try:
            firsts = torch.autograd.grad([outputs[k] for k in diff], prepared.leaves, cotangents,
                                         create_graph=True, allow_unused=True)
        except Exception as error:
            raise raised_by_op("backward", error) from error
        firsts = [torch.zeros_like(x) if g is None else as_dense(g) for x, g in zip(prepared.leaves, firsts)]
        if "w" not in draws:
            draws["w"] = [normal(tuple(g.shape), context.generator)
                          .to(dtype).to(torch.float64) for g in firsts]
        pairs = [(g, w.to(device=g.device, dtype=g.dtype)) for g, w in zip(firsts, draws["w"]) if g.requires_grad]
        wrt = list(prepared.leaves) + cotangents
        if pairs:
            try:
                seconds = torch.autograd.grad([g for g, _ in pairs], wrt, [w for _, w in pairs], allow_unused=True)
            except Exception as error:
                raise raised_by_op("backward", error) from error
        else:
            seconds = [None] * len(wrt)
        seconds = [torch.zeros_like(x) if s is None else as_dense(s).detach() for x, s in zip(wrt, seconds)]
        names = list(prepared.names) + [f"grad_output{'' if len(diff) == 1 else ' ' + str(k)}" for k in diff]
        return Run([], seconds, names)

    op_low = run(dtype, None)
    try:
        ref_truth = run(torch.float64, context.case.reference)
    except OpRaised as raised:
        context.fail_reference_raised(ReferenceRaised(raised.phase, raised.error))
    try:
        ref_low = run(dtype, context.case.reference)
    except OpRaised:
        ref_low = None
    return against_reference(op_low, ref_truth, ref_low, dtype, _precision_k(context.case))
