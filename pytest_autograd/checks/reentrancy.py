"""reentrancy: two calls in flight at once give what each call gives alone.

State kept on the Function class or in a module between forward and backward
(an input stashed on the class and overwritten by the next call, a gradient
buffer that is never zeroed) is invisible when every forward is followed at
once by its own backward, which is what the other checks do. A model that
uses the op twice interleaves the calls:
``y1 = op(a); y2 = op(b); backward(y1); backward(y2)``. This check runs
exactly that and compares every output and gradient with isolated runs of
the same calls.
"""

import torch

from pytest_autograd.checks.base import Check
from pytest_autograd.execution import grads_of, output_label, random_cotangents

HINT = ("keep per-call state on ctx (ctx.save_for_backward for tensors, ctx attributes for the rest), never on "
        "the Function class or a module global, and build each gradient in a fresh tensor: state shared between "
        "calls is overwritten by the next forward, and a buffer that is not zeroed accumulates across calls")
SEQUENCE = "interleaved: y1 = op(a); y2 = op(b); backward(y1); backward(y2); compared with each call run alone"


class Reentrancy(Check):
    name = "reentrancy"
    description = "two interleaved calls (forward a, forward b, backward a, backward b) match the same calls run alone"

    def run(self, context):
        skipped = 0
        for index, sample in context.samples():
            prepared = context.prepare(sample)
            if not prepared.leaves:
                skipped += 1
                continue
            second = varied_leaves(prepared.leaves, context.generator)
            seeds = [int(torch.randint(0, 2**31 - 1, (1,), generator=context.generator)) for _ in range(2)]
            calls = [(prepared.leaves, seeds[0]), (second, seeds[1])]
            alone, cotangents = [], []
            for leaves, seed in calls:
                outputs = _forward(context, prepared, leaves, seed)
                cotangents.append(random_cotangents(outputs, context.generator))
                grads = _backward(prepared, outputs, leaves, cotangents[-1])
                alone.append(_detached(outputs, grads))
            in_flight = [_forward(context, prepared, leaves, seed) for leaves, seed in calls]
            grads = [_backward(prepared, outputs, leaves, cotangent)
                     for outputs, (leaves, _), cotangent in zip(in_flight, calls, cotangents)]
            together = [_detached(outputs, g) for outputs, g in zip(in_flight, grads)]
            for call, (expected, got) in enumerate(zip(alone, together), start=1):
                _compare(context, prepared, call, expected, got)
        if skipped == len(context.case.samples):
            import pytest

            pytest.skip("the op has no differentiable floating-point input to vary between two calls")


def varied_leaves(leaves, generator):
    """Different values of the same sign and shape (|x| scaled by 0.5 to 0.9), so the op's domain is kept."""
    varied = []
    for leaf in leaves:
        factor = 0.5 + 0.4 * torch.rand(leaf.shape, generator=generator, dtype=torch.float64)
        value = (leaf.detach() * factor.to(device=leaf.device, dtype=leaf.dtype)).requires_grad_(True)
        varied.append(value)
    return varied


def _forward(context, prepared, leaves, seed):
    torch.manual_seed(seed)  # an op that draws random numbers draws the same ones in both runs
    return context.run_op(prepared, leaves)


def _backward(prepared, outputs, leaves, cotangents):
    if not any(out.requires_grad for out in outputs):
        return []
    return grads_of(outputs, leaves, cotangents)


def _detached(outputs, grads):
    return [out.detach().clone() for out in outputs], [g.detach().clone() for g in grads]


def _compare(context, prepared, call, expected, got):
    (outputs_alone, grads_alone), (outputs_together, grads_together) = expected, got
    which = "first" if call == 1 else "second"
    count = len(outputs_alone)
    for k, (a, b) in enumerate(zip(outputs_alone, outputs_together)):
        label = output_label(k, count)
        context.compare(a, b, f"interleaved calls change the results: {label} of the {which} call differs from "
                              "the same call run alone", label, hint=HINT, output=label, details=[SEQUENCE])
    for name, a, b in zip(prepared.names, grads_alone, grads_together):
        context.compare(a, b, f"interleaved calls change the results: the gradient w.r.t. `{name}` of the {which} "
                              "call differs from the same call run alone", f"grad {name}", hint=HINT,
                        argument=name, details=[SEQUENCE])


check = Reentrancy()
