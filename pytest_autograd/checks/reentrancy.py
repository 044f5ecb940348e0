"""reentrancy: two calls in flight at once give what each call gives alone.

State kept on the Function class or in a module between forward and backward
(an input stashed on the class and overwritten by the next call, a gradient
buffer that is never zeroed) is invisible when every forward is followed at
once by its own backward, which is what the other checks do. A model that
uses the op twice interleaves the calls:
``y1 = op(a); y2 = op(b); backward(y1); backward(y2)``. This check runs
exactly that and compares every output and gradient with isolated runs of
the same calls (a sample's own isolated run is its plain run, shared with the
other checks that compare the op with itself: ``_plain_run``).
"""


from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._reruns import compare_runs, draw_seed, seed_generators
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    grads_of,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import skip

HINT = ("keep per-call state on ctx (ctx.save_for_backward for tensors, ctx attributes for the rest), never on "
        "the Function class or a module global, and build each gradient in a fresh tensor: state shared between "
        "calls is overwritten by the next forward, and a buffer that is not zeroed accumulates across calls")


class Reentrancy(Check):
    name = "reentrancy"
    description = "two interleaved calls (forward a, forward b, backward a, backward b) match the same calls run alone"

    def run(self, context):
        prepared = [context.prepare(judged_sample(context, index, sample)) for index, sample in context.samples()]
        if not any(p.leaves for p in prepared):

            skip("the op has no differentiable floating-point input to vary between two calls")
        alone = {}  # sample index -> (seed, cotangents, detached results) of the sample run alone
        for index, first in enumerate(prepared):
            context.sample_index = index
            if not first.leaves:
                continue
            context.dtype = first.leaves[0].dtype
            key, second, second_leaves, label = _second_call(prepared, index)
            calls = [(index, first, first.leaves), (key, second, second_leaves)]
            for call, (key, sample, leaves) in enumerate(calls):
                if key in alone:
                    continue
                if isinstance(key, int):  # a sample as it is: its plain run is the call alone
                    plain = plain_run(context, key, sample)
                    alone[key] = plain.seed, plain.cotangents, (plain.outputs, plain.grads)
                    continue
                seed = draw_seed(context.generator)
                try:
                    outputs = _forward(context, sample, leaves, seed)
                    cotangents = random_cotangents(outputs, context.generator, repeating=True)
                    alone[key] = seed, cotangents, _detached(outputs, _backward(outputs, leaves, cotangents))
                except OpRaised:
                    if call == 0 or second is not first:
                        raise
                    skip(f"the op raised on {label}, the second input it was given; return two samples so "
                         "that interleaved calls can use both")
            sequence = (f"interleaved: y1 = op(sample {index}); y2 = op({label}); backward(y1); backward(y2); "
                        "compared with each call run alone")
            try:
                in_flight = [_forward(context, sample, leaves, alone[key][0]) for key, sample, leaves in calls]
                grads = [_backward(outputs, leaves, alone[key][1])
                         for outputs, (key, _, leaves) in zip(in_flight, calls)]
            except OpRaised as raised:  # each call alone ran: only the interleaving makes it raise
                context.fail_raised(raised, "only when two calls are interleaved", hint=HINT, details=[sequence])
            together = [_detached(outputs, g) for outputs, g in zip(in_flight, grads)]
            for call, ((key, sample, _), got) in enumerate(zip(calls, together), start=1):
                _compare(context, sample, call, alone[key][2], got, sequence)
        context.sample_index = None


def _second_call(prepared, index):
    """(key, prepared, leaves, label) of the call interleaved with sample ``index``.

    The next sample (values from the user, so inside the op's domain), or,
    with only one sample, its inputs scaled by 0.75.
    """
    others = [k for k, p in enumerate(prepared) if k != index and p.leaves]
    if others:
        k = ([k for k in others if k > index] or others)[0]
        return k, prepared[k], prepared[k].leaves, f"sample {k}"
    label = f"sample {index} scaled by 0.75"
    return label, prepared[index], varied_leaves(prepared[index].leaves), label


def varied_leaves(leaves):
    """The same tensors times 0.75: other values, with signs, order, ratios and equalities of sums kept."""
    return [(leaf.detach() * 0.75).requires_grad_(True) for leaf in leaves]


def _forward(context, prepared, leaves, seed):
    seed_generators(context.device, seed)  # an op that draws random numbers draws the same ones in both runs
    return context.run_op(prepared, leaves)


def _backward(outputs, leaves, cotangents):
    if not any(out.requires_grad for out in outputs):
        return []
    return grads_of(outputs, leaves, cotangents)


def _detached(outputs, grads):
    return [out.detach().clone() for out in outputs], [g.detach().clone() for g in grads]


def _compare(context, prepared, call, expected, got, sequence):
    (outputs_alone, grads_alone), (outputs_together, grads_together) = expected, got
    which = "first" if call == 1 else "second"
    count = len(outputs_alone)
    for k, (a, b) in enumerate(zip(outputs_alone, outputs_together)):
        label = output_label(k, count)
        compare_runs(context, a, b,
                     f"interleaved calls change the results: {label} of the {which} call differs from the same call "
                     "run alone", label, hint=HINT, output=label, details=[sequence])
    for name, a, b in zip(prepared.names, grads_alone, grads_together):
        compare_runs(context, a, b,
                     f"interleaved calls change the results: the gradient w.r.t. `{name}` of the {which} call "
                     "differs from the same call run alone", f"grad {name}", hint=HINT, argument=name,
                     details=[sequence])


check = Reentrancy()
