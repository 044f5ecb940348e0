"""gradgradcheck: second derivatives, i.e. the backward is itself differentiable.

Runs the first-derivative engine on ``(inputs, grad_outputs) -> backward``.
A backward that silently is not differentiable (detached tensors, a raw
kernel) gives all-zero analytical second derivatives: the report says so
instead of "Jacobian mismatch".
"""

import functools
import math

import torch

from pytest_autograd.checks._derivatives import (
    ATOL,
    EPS,
    RTOL,
    KinkNotes,
    find_derivative_error,
    marker_tolerances,
)
from pytest_autograd.checks._first_order import first_order, let_go
from pytest_autograd.checks._float32_blind import plan_after_float64_pass
from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._low_precision import judge_second_derivatives, skip_unjudged
from pytest_autograd.checks._hints import derivative_details
from pytest_autograd.checks._hygiene import written_by_backward
from pytest_autograd.checks._loci import derivative_locus
from pytest_autograd.checks._numerical import Precomputed, spent_graph
from pytest_autograd.checks._saved_intermediates import frozen_explains, saved_intermediate_hint
from pytest_autograd.checks._second_derivative_hints import (
    DOUBLE_BACKWARD_HINT,
    NON_FINITE_HINT,
    graphless_saved_tensors,
    refuses_double_backward,
)
from pytest_autograd.checks._surrogate import OPTION, surrogate_reason
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.backward_only import (
    SECOND_DERIVATIVE_REASON,
    only_backward_works,
)
from pytest_autograd.engine.case import is_once_differentiable
from pytest_autograd.engine.execution import (
    OpRaised,
    as_dense,
    constants_only_reason,
    differentiable_indices,
    has_floating_input,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import raised_by_op, skip

NOT_DIFFERENTIABLE_HINT = (
    "backward is not differentiable w.r.t. `{name}`: it likely uses detached tensors (.detach(), .data, "
    ".item(), numpy) or a kernel without autograd support. Write backward with differentiable torch ops, "
    "or declare it with @once_differentiable / double_backward=False on the marker"
)


class GradGradCheck(Check):
    name = "gradgradcheck"
    description = "analytical vs numerical second derivatives (double backward) in float64"
    options = {"dtypes": None, **OPTION}  # dtypes: those the op supports; without float64 it is judged in the best one

    def applies(self, case, device):
        surrogate = surrogate_reason(case, self.name)
        if surrogate:
            return surrogate
        if case.option("double_backward") is False:
            return "double_backward=False on the marker declares that the op has no second derivative"
        if case.is_function and is_once_differentiable(case.op):
            return "the op's backward is @once_differentiable: its author declared no second derivative"
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return constants_only_reason(case)

    def run(self, context):
        notes, unjudged = KinkNotes(), []
        for index, sample in context.samples():
            plan = float64_plan(context, sample)
            if plan is not None:
                judge_second_derivatives(context, sample, plan, functools.partial(_backward_function, context),
                                         unjudged)
                continue
            prepared = context.prepare(sample, dtype=torch.float64)
            if not prepared.leaves:
                continue
            first_grads_require_grad = []
            declared_once = []  # an @once_differentiable part inside the op (e.g. a plain function calling one)

            def record(grads):
                first_grads_require_grad.append([g is not None and g.requires_grad for g in grads])
                declared_once.append(any(_reaches_error_node(g) for g in grads if g is not None))

            differentiable = []
            try:
                shared = first_order(context, index, prepared, second=True)
                let_go(context, index)  # nothing after this check wants it
                prepared, outputs = shared.prepared, shared.outputs
                differentiable = differentiable_indices(outputs)
                if not differentiable:
                    continue
                if shared.second and not shared.spent:
                    backward, leaves, leaf_names, first, precomputed = _from_first_order(
                        context, shared, differentiable, record)
                else:  # made without gradgradcheck's share, or backward spoiled its graph: everything anew
                    backward, leaves, leaf_names = _backward_function(context, prepared, outputs, differentiable,
                                                                      record)
                    first, precomputed = None, None
                noted_before = len(notes.lines)
                error = find_derivative_error(
                    backward, leaves, leaf_names, [f"grad {name}" for name in prepared.names], context.generator,
                    numerical_needs_grad=True, notes=notes, outputs=first, precomputed=precomputed,
                    draws=shared.draws, **marker_tolerances(context.case),
                )
                plan = plan_after_float64_pass(context, sample, notes, noted_before) if error is None else None
                notes.flush(context)
                if plan is not None:
                    judge_second_derivatives(context, sample, plan, functools.partial(_backward_function, context),
                                             unjudged)
                    continue
            except OpRaised as raised:
                if only_backward_works(raised.error):
                    skip(SECOND_DERIVATIVE_REASON)
                if "once_differentiable" in str(raised.error):
                    skip("the op's backward is @once_differentiable: its author declared no second derivative")
                if refuses_double_backward(raised.error):
                    context.fail_raised(raised, "while taking the second derivative", hint=DOUBLE_BACKWARD_HINT)
                _fail_if_backward_overwrites_what_it_needs(context, prepared, differentiable, raised)
                raise
            if any(declared_once):
                skip("part of the op's backward is @once_differentiable (its gradient graph holds an Error node): "
                     "its author declared no second derivative")
            if error is None:
                continue
            if error.argument_grad_all_zero and error.numerical_nonzero:
                detached = not any(any(row) for row in first_grads_require_grad)
                summary = ("backward is not differentiable: its results do not require grad, so every second "
                           "derivative is zero" if detached else
                           f"backward is not differentiable w.r.t. `{error.argument}`: the analytical second "
                           "derivative is all zeros while the numerical one is not")
                context.fail(summary, output=error.output, argument=error.argument, worst=error.worst(),
                             error=error.error_line(), evidence=error.evidence, details=derivative_details(error),
                             hint=(_saved_intermediate(error, context, prepared, outputs, differentiable, leaves)
                                   or NOT_DIFFERENTIABLE_HINT.format(name=error.argument)),
                             **_loci(error, context, prepared, leaves, differentiable))
            context.fail(
                f"second derivative of {error.output} w.r.t. `{error.argument}` does not match the numerical one",
                output=error.output, argument=error.argument, worst=error.worst(), error=error.error_line(),
                details=derivative_details(error),
                evidence=error.evidence + [e for other in error.others for e in other.evidence],
                hint=_mismatch_hint(error, context, prepared, outputs, differentiable, leaves),
                **_loci(error, context, prepared, leaves, differentiable),
            )
        skip_unjudged(context, self.name, unjudged)


def _fail_if_backward_overwrites_what_it_needs(context, prepared, differentiable, raised):
    """A backward that writes into the op's inputs (a memory-saving backward) cannot be differentiated again:
    torch's "modified by an inplace operation" error is that, said in its terms; say it in the op's."""
    if not spent_graph(raised):
        return
    try:
        written = [name for _, name in written_by_backward(context.case, prepared, differentiable)]
    except Exception:  # noqa: BLE001 - no diagnosis: torch's own error stands
        return
    if not written:
        return
    names = ", ".join(f"`{name}`" for name in written)
    context.fail(f"backward is not differentiable: it writes into the op's input{'s' if len(written) > 1 else ''} "
                 f"{names} in place, which its own gradient needs",
                 details=[f"double backward raised RuntimeError: {str(raised.error).split('. Hint:')[0]}"],
                 hint=("a memory-saving backward (gradients written into the saved inputs) has no second derivative: "
                       "declare double_backward=False on the marker if the op is not meant to be differentiated "
                       "twice; otherwise write the gradients to new tensors"))


def _loci(error, context, prepared, leaves, differentiable):
    """The report's locus (and its other wrong arguments'), for a script that recomputes them."""
    def locus(found):
        return derivative_locus(found, context, prepared, order=2, first_cotangents=leaves[len(prepared.leaves):],
                                differentiable=differentiable)

    return {"locus": locus(error), "also": [{"argument": other.argument, "output": other.output,
                                             "worst": other.worst(), "locus": locus(other)} for other in error.others]}


def _mismatch_hint(error, context, prepared, outputs, differentiable, leaves):
    """The hint the evidence supports: non-finite values, a graph-less saved intermediate that explains the whole
    error (see _saved_intermediates), else the general one."""
    if not math.isfinite(error.got) and math.isfinite(error.expected):
        return NON_FINITE_HINT
    return (_saved_intermediate(error, context, prepared, outputs, differentiable, leaves)
            or "the backward's own gradient is wrong: check the ops backward uses on saved tensors")


def _saved_intermediate(error, context, prepared, outputs, differentiable, leaves):
    """The saved-intermediate hint when holding forward's graph-less saved tensors fixed explains ``error``."""
    if error.argument not in prepared.names:  # w.r.t. a grad_output: backward is linear there, nothing is lost
        return None
    tolerances = marker_tolerances(context.case)
    explained = frozen_explains(
        error, leaves, lambda around: _make_backward(context, prepared, differentiable, around_forward=around),
        EPS, tolerances.get("atol", ATOL), tolerances.get("rtol", RTOL))
    if explained is None:
        return None
    constants = [value for value in list(prepared.args) + list(prepared.kwargs.values())
                 if isinstance(value, torch.Tensor) and value.is_floating_point() and not value.requires_grad]
    return saved_intermediate_hint(graphless_saved_tensors(outputs, constants), error.argument)


def _backward_function(context, prepared, outputs, differentiable, on_grads=None):
    """``(leaves -> first gradients, leaves, names)``: inputs and cotangents in, the op's backward out.

    ``on_grads`` sees each call's raw gradients (before unused ones become zeros).
    """
    cotangent_leaves = [c.requires_grad_(True) for c in
                        random_cotangents([outputs[k] for k in differentiable], context.generator)]
    backward = _make_backward(context, prepared, differentiable, on_grads)
    return backward, list(prepared.leaves) + cotangent_leaves, _leaf_names(prepared, outputs, differentiable)


def _leaf_names(prepared, outputs, differentiable):
    """The backward's arguments by name: the op's, then ``grad_output`` (``grad_output0``, ...) per differentiated
    output."""
    names = [output_label(k, len(outputs)) for k in range(len(outputs))]
    return prepared.names + [f"grad_{names[k].replace(' ', '')}" for k in differentiable]


def _from_first_order(context, shared, differentiable, on_grads):
    """``(backward, leaves, names, first gradients, Precomputed)`` from the sample's FirstOrder: its cotangents
    are the backward's cotangent leaves, its first gradients (with their graph) the backward's value there, and
    its probe evaluations (made with gradcheck's, when it ran) those of the first probes."""
    prepared = shared.prepared
    leaves = list(prepared.leaves) + shared.second_cotangents()
    on_grads(shared.grads)
    precomputed = Precomputed(cotangents=None, analytical=None, directions=shared.drawn,
                              at=shared.backward_at, eps=shared.eps)
    return _make_backward(context, prepared, differentiable, on_grads), leaves, \
        _leaf_names(prepared, shared.outputs, differentiable), shared.grads, precomputed


def _make_backward(context, prepared, differentiable, on_grads=None, around_forward=None):
    """``leaves -> first gradients``, leaves being the inputs then one cotangent per differentiable output.

    ``around_forward(run)``: calls ``run()``, the op's forward, and returns its outputs (the saved-intermediate
    experiment holds saved tensors fixed there).
    """
    n_inputs = len(prepared.leaves)

    def first_gradients(leaves, create_graph):
        inputs, cotangents = leaves[:n_inputs], leaves[n_inputs:]
        run = lambda: context.run_op(prepared, inputs)  # noqa: E731
        outs = run() if around_forward is None else around_forward(run)
        pairs = [(outs[k], c) for k, c in zip(differentiable, cotangents) if outs[k].requires_grad]
        try:
            grads = torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs],
                                        create_graph=create_graph, allow_unused=True)
        except Exception as error:
            raise raised_by_op("backward", error) from error
        if create_graph and on_grads is not None:
            on_grads(grads)
        return [torch.zeros_like(x) if g is None else as_dense(g) for x, g in zip(inputs, grads)]

    def backward(leaves):
        return first_gradients(leaves, create_graph=True)

    # The numerical second derivatives need the first gradients' values only: no graph of the backward is built
    # for them (recording it costs a third of a backward more, at every evaluation).
    backward.values_only = lambda leaves: first_gradients(leaves, create_graph=False)
    return backward


def _reaches_error_node(grad):
    """True when ``grad``'s graph holds the node @once_differentiable puts there.

    torch.autograd.grad only runs nodes on a path to the requested inputs,
    and that node hangs off detached copies, so it never raises here: the
    second derivative through it would silently be zero.
    """
    seen, stack = set(), [grad.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == "torch::autograd::Error":
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


check = GradGradCheck()
