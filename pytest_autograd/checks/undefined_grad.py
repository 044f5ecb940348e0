"""undefined_grad: backward copes with outputs whose gradient is undefined.

When a caller uses only some outputs of a multi-output op, the others'
gradients are undefined. With the default ``materialize_grads`` autograd
turns them into zeros; after ``ctx.set_materialize_grads(False)`` backward
receives ``None`` and must handle it. gradcheck always feeds every output a
gradient, so this path goes untested until a user leaves an output unused.

Scenarios, per sample: each differentiable output used alone; with three or
more outputs, each left out in turn; and every output undefined at once,
through ``torch._C._functions.UndefinedGrad`` (as gradcheck's
``check_undefined_grad`` does). The last one also covers single-output ops:
an undefined gradient reaches them when a downstream op's backward returns
``None`` for them, and a ``set_materialize_grads(False)`` backward must
handle that too.
"""

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.backward_only import autograd_grad
from pytest_autograd.engine.device_faults import raise_if_fault
from pytest_autograd.engine.execution import (
    OpRaised,
    as_dense,
    differentiable_indices,
    grads_of,
    has_floating_input,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import skip

NONE_HINT = ("with ctx.set_materialize_grads(False), backward receives None for every output whose gradient is "
             "undefined: test `if grad is None` and use zeros (or skip that term); or drop "
             "set_materialize_grads(False) so autograd passes zeros")


def undefined_grad_node():
    functions = getattr(torch._C, "_functions", None)
    factory = getattr(functions, "UndefinedGrad", None)
    return None if factory is None else factory()


class UndefinedGrad(Check):
    name = "undefined_grad"
    description = "backward handles undefined (None) gradients of unused outputs"

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return None

    def run(self, context):
        ran = False
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            if not prepared.leaves:
                continue
            outputs = context.run_op(prepared)
            used = differentiable_indices(outputs)
            if not used:
                continue
            ran = True
            count = len(outputs)
            cotangents = random_cotangents(outputs, context.generator, repeating=True)
            scenarios = [[k] for k in used] if len(used) > 1 else []
            if len(used) > 2:
                scenarios += [[j for j in used if j != k] for k in used]
            for kept in scenarios:
                self._check_partial(context, prepared, cotangents, kept, used, count)
            self._check_all_undefined(context, outputs, prepared, used, count)
        if not ran:
            skip("no sample has a floating output that requires grad: there is no gradient to leave undefined")

    def _check_partial(self, context, prepared, cotangents, kept, used, count):
        """Backward through the outputs in ``kept`` only; the rest get no gradient at all."""
        unused = [output_label(k, count) for k in used if k not in kept]
        situation = (f"when only {', '.join(output_label(k, count) for k in kept)} "
                     f"{'is' if len(kept) == 1 else 'are'} used ({', '.join(unused)} left unused, "
                     f"{'its gradient' if len(unused) == 1 else 'their gradients'} undefined)")
        expected_outputs = context.run_op(prepared)
        zeros = [c if k in kept or c is None else torch.zeros_like(c) for k, c in enumerate(cotangents)]
        expected = grads_of(expected_outputs, prepared.leaves, zeros)
        outputs = context.run_op(prepared)
        try:
            got = grads_of([outputs[k] for k in kept], prepared.leaves, [cotangents[k] for k in kept])
        except OpRaised as raised:
            context.fail_raised(raised, situation, hint=NONE_HINT, output=", ".join(unused))
        for name, want, grad in zip(prepared.names, expected, got):
            context.compare(want.detach(), grad.detach(),
                            f"gradient w.r.t. `{name}` is wrong {situation}", f"grad {name}",
                            output=", ".join(unused), argument=name,
                            hint="an undefined gradient must act like a zero gradient; " + NONE_HINT)

    def _check_all_undefined(self, context, outputs, prepared, used, count):
        """Every differentiable output's gradient undefined: backward must return nothing or zeros (through the
        graph of ``outputs``, the sample's first forward, which no backward has used)."""
        node = undefined_grad_node()
        if node is None:
            return
        labels = [output_label(k, count) for k in used]
        situation = (f"when the gradient of {' and '.join(labels)} is undefined"
                     if len(labels) == 1 else "when the gradients of all outputs are undefined")
        undefined = [node(outputs[k]) for k in used]
        try:
            grads = autograd_grad(undefined, prepared.leaves, [torch.ones_like(u) for u in undefined])
            grads = [as_dense(g) for g in grads]
        except Exception as error:
            raise_if_fault(error, "backward")
            context.fail_raised(OpRaised("backward", error), situation, hint=NONE_HINT, output=", ".join(labels))
        for name, grad in zip(prepared.names, grads):
            if grad is not None and not bool((grad == 0).all()):
                context.fail(f"backward returns a non-zero gradient for `{name}` {situation}",
                             output=", ".join(labels), argument=name,
                             hint="an undefined output gradient stands for zero: the input gradient must be "
                                  "None or zeros")


check = UndefinedGrad()
