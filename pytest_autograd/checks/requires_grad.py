"""requires_grad: backward is right whichever inputs require grad.

gradcheck makes every floating input require grad, so a backward that
misreads ``ctx.needs_input_grad`` (wrong index, a gradient skipped for an
input that does need it, a gradient returned for a ``None`` argument) passes
it and breaks in the field, where frozen weights or a constant bias are the
norm. Each subset of inputs is compared with the all-inputs run under one
shared cotangent (that run is the sample's plain run, shared with the
checks that compare the op with itself: ``_plain_run``). The empty subset
is the inference path (nothing requires grad): an op with one input is
judged there too, so a forward that takes a faster, different formula when
no gradient is needed (a tanh-approximated GELU at inference) fails. Each
run starts from the plain run's seed, so an op drawing random numbers draws
the same ones.
"""

from itertools import combinations

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import quoted
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    floating_tensors,
    grads_of,
    output_label,
)
from pytest_autograd.engine.outcomes import skip

ALL_SUBSETS_UP_TO = 4  # differentiable inputs; beyond this a covering set of subsets

HINT = ("gate each gradient on its own flag, ctx.needs_input_grad[i] with i the argument's position in forward, "
        "and return None (or the gradient) for every input that does not need one")


def subsets(count):
    """Proper subsets of ``range(count)`` to try: all of them when few, else a covering set.

    The covering set: nothing, each input alone, all but one, and each
    adjacent pair, which is where off-by-one ``needs_input_grad`` indices show.
    """
    if count <= ALL_SUBSETS_UP_TO:
        return [subset for size in range(count) for subset in combinations(range(count), size)]
    chosen = [()]
    chosen += [(i,) for i in range(count)]
    chosen += [(i, i + 1) for i in range(count - 1)]
    chosen += [tuple(j for j in range(count) if j != i) for i in range(count)]
    return list(dict.fromkeys(chosen))


class RequiresGrad(Check):
    name = "requires_grad"
    description = "forward and backward are right for every subset of inputs requiring grad (ctx.needs_input_grad)"

    def applies(self, case, device):
        if not any(floating_tensors(sample) for sample in case.samples):
            return "the op has no floating-point tensor argument: there is no input to require grad"
        return None

    def run(self, context):
        checked = False
        for index, sample in context.samples():
            sample = judged_sample(context, index, sample)
            full = context.prepare(sample)
            if not full.leaves:
                continue
            checked = True
            try:
                plain = plain_run(context, index, full)
            except OpRaised as raised:
                if raised.phase != "backward":
                    raise
                _fail_raised(context, raised, "when every floating input requires grad",
                             [f"requiring grad: {', '.join(full.names)}"])
            outputs, cotangents = plain.outputs, plain.cotangents
            grads = plain.grads or [torch.zeros_like(leaf) for leaf in full.leaves]
            expected = dict(zip(full.slots, grads))
            for subset in subsets(len(full.leaves)):
                self._check_subset(context, sample, full, outputs, cotangents, expected,
                                   [full.slots[i] for i in subset], plain.seed)
        if not checked:
            constants = context.case.option("constants")
            skip(f"constants={constants!r} leaves no differentiable input in any sample: there is no input to "
                 "require grad" if constants is not None else
                 "no sample has a differentiable input: there is no input to require grad")

    def _check_subset(self, context, sample, full, outputs, cotangents, expected, slots, seed):
        prepared = context.prepare(sample, only=set(slots))
        names = prepared.names
        others = [name for name in full.names if name not in names]
        situation = (f"when only {quoted(names)} require{'s' if len(names) == 1 else ''} grad"
                     if names else "when no input requires grad")
        details = [f"requiring grad: {', '.join(names) or 'nothing'}; not requiring grad: {', '.join(others)}"]
        try:
            seed_generators(context.device, seed)
            got_outputs = context.run_op(prepared)
        except OpRaised as raised:
            _fail_raised(context, raised, situation, details)
        count = len(outputs)
        if len(got_outputs) != count:
            context.fail(f"forward returns {len(got_outputs)} tensor output(s) {situation}, {count} otherwise",
                         details=details)
        for k, (want, got) in enumerate(zip(outputs, got_outputs)):
            label = output_label(k, count)
            context.compare(want.detach(), got.detach(), f"{label} changes {situation}", label, output=label,
                            details=details)
        if not names:
            return
        try:
            grads = grads_of(got_outputs, prepared.leaves, cotangents)
        except OpRaised as raised:
            _fail_raised(context, raised, situation, details)
        for name, slot, grad in zip(names, prepared.slots, grads):
            want = expected[slot]
            hint = HINT
            if bool((grad == 0).all()) and not bool((want == 0).all()):
                hint = f"backward returned no gradient for `{name}` although it requires grad; " + HINT
            context.compare(want.detach(), grad.detach(), f"gradient w.r.t. `{name}` is wrong {situation}",
                            f"grad {name}", argument=name, hint=hint, details=details)


def _fail_raised(context, raised, situation, details):
    hint = None
    if raised.phase == "backward":
        hint = HINT
        if "was not a Variable" in str(raised.error):
            hint = ("backward returned a gradient for an argument that is not a tensor (e.g. bias=None): "
                    "return None there; " + HINT)
    context.fail_raised(raised, situation, hint=hint, details=details)


check = RequiresGrad()
