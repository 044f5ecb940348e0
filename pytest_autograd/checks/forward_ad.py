"""forward_ad: a Function's ``jvp`` against numerical derivatives and its own backward.

gradcheck exercises backward only, so a wrong ``jvp`` ships unnoticed until
someone calls ``torch.func.jvp`` or ``jacfwd``. In float64, along a random
direction in each input alone (so a mismatch names the argument) and in all
of them at once: the tangent must equal the central difference, and
``<v, J u>`` from the tangent must equal ``<J^T v, u>`` from backward.
"""

import torch
import torch.autograd.forward_ad as fwAD

from pytest_autograd.checks._derivatives import ATOL, EPS, RTOL
from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._patterns import describe_factor, factor_of
from pytest_autograd.checks._transforms import overrides
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    differentiable_indices,
    grads_of,
    has_floating_input,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.results.compare import compare_tensors, fmt


class ForwardAD(Check):
    name = "forward_ad"
    description = "a Function's jvp matches numerical directional derivatives and agrees with its backward"

    def applies(self, case, device):
        if not case.is_function:
            return "op is not an autograd.Function: forward_ad checks a Function's own jvp"
        if not overrides(case.op, "jvp"):
            return "op defines no jvp (forward-mode AD is not supported, nothing to check)"
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return None

    def run(self, context):
        atol, rtol = context.case.option("atol", ATOL), context.case.option("rtol", RTOL)
        for index, sample in context.samples():
            plan = float64_plan(context, sample)
            if plan is not None:
                skip(f"{plan.reason}: forward-mode AD is checked against float64 central differences only")
            prepared = context.prepare(sample, dtype=torch.float64)
            if not prepared.leaves:
                continue
            outputs = context.run_op(prepared)
            count = len(outputs)
            diff = differentiable_indices(outputs)
            if not diff:
                continue
            cotangents = dict(zip(diff, random_cotangents([outputs[k] for k in diff], context.generator)))
            grads = [g.detach() for g in grads_of([outputs[k] for k in diff], prepared.leaves,
                                                  [cotangents[k] for k in diff])]
            for where, tangents in _directions(prepared, context.generator):
                forward = _tangents(context, prepared, tangents)
                numerical = _central_difference(context, prepared, tangents)
                for k in diff:
                    label = output_label(k, count)
                    got = torch.zeros_like(numerical[k]) if forward[k] is None else forward[k]
                    mismatch = compare_tensors(numerical[k], got, atol, rtol)
                    if mismatch is not None:
                        context.fail_mismatch(
                            mismatch, f"jvp: tangent of {label} along a direction in {where} does not match "
                                      "the numerical directional derivative",
                            f"tangent of {label}", output=label, argument=_argument(where),
                            hint=_hint(numerical[k], forward[k], where, atol))
                from_forward = sum(float((cotangents[k] * (forward[k] if forward[k] is not None else 0)).sum())
                                   for k in diff)
                from_backward = sum(float((g * t).sum()) for g, t in zip(grads, tangents))
                scale = sum(float((cotangents[k] * numerical[k]).abs().sum()) for k in diff)
                if abs(from_forward - from_backward) > atol + rtol * scale:
                    context.fail(
                        f"forward and backward mode disagree along a direction in {where}: "
                        "<v, J u> from jvp differs from <J^T v, u> from backward",
                        argument=_argument(where),
                        error=f"jvp gives {fmt(from_forward)}, backward gives {fmt(from_backward)} "
                              f"(abs error {fmt(abs(from_forward - from_backward))} > tolerance "
                              f"{fmt(atol + rtol * scale)})",
                        hint="jvp matches the numerical derivative, so backward is the wrong one "
                             "(run gradcheck to see which element)")


def _directions(prepared, generator):
    """A random direction in each input alone, then in all inputs at once."""
    random = [torch.randn(leaf.shape, generator=generator, dtype=torch.float64).to(leaf.device)
              for leaf in prepared.leaves]
    directions = []
    for j, name in enumerate(prepared.names):
        directions.append((f"`{name}`", [r if i == j else torch.zeros_like(r) for i, r in enumerate(random)]))
    if len(prepared.leaves) > 1:
        directions.append(("all inputs", random))
    return directions


def _tangents(context, prepared, tangents):
    with fwAD.dual_level():
        duals = [fwAD.make_dual(leaf.detach(), t) for leaf, t in zip(prepared.leaves, tangents)]
        try:
            outputs = context.run_op(prepared, leaves=duals)
        except OpRaised as raised:
            raise OpRaised("forward-mode AD (forward + jvp)", raised.error) from raised.error
        result = []
        for output in outputs:
            tangent = fwAD.unpack_dual(output).tangent if output.is_floating_point() else None
            result.append(None if tangent is None else tangent.detach().clone())
    return result


def _central_difference(context, prepared, tangents):
    def at(sign):
        moved = [leaf.detach() + sign * EPS * t for leaf, t in zip(prepared.leaves, tangents)]
        with torch.no_grad():
            return [o.detach() for o in context.run_op(prepared, leaves=moved)]

    plus, minus = at(1.0), at(-1.0)
    return [(p - m) / (2 * EPS) if p.is_floating_point() else None for p, m in zip(plus, minus)]


def _argument(where):
    return where.strip("`") if where.startswith("`") else None


def _hint(numerical, forward, where, atol):
    if forward is None or (bool((forward == 0).all()) and not bool((numerical == 0).all())):
        return (f"jvp returns no tangent (None or zeros) for a direction in {where}: check the order of "
                "jvp's tangent arguments (one per forward input) and what ctx.save_for_forward saved")
    # Element by element (a tolerance relative to the largest element let it decide for the small ones).
    factor = factor_of(numerical, forward, atol)
    if factor == -1.0:
        return "the tangent has the wrong sign at every element"
    if factor is not None:
        return f"the tangent is {describe_factor(factor)} the numerical one at every element: a constant factor is off"
    return ("jvp must return J(x) @ tangents: the sum over inputs of each input's partial derivative "
            "times that input's tangent")


check = ForwardAD()
