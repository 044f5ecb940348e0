"""accumulation: two micro-batches' backwards accumulate the sum of their gradients into ``.grad``.

Gradient accumulation runs forward and backward on several micro-batches
before one optimizer step; torch adds each backward's gradients into the
parameters' ``.grad``. Where ``.grad`` is still empty, torch keeps the very
tensor backward returned as ``.grad`` when nothing else holds it (a view of
a buffer qualifies), and adds the next backward's gradients into it in
place. A backward that returns a preallocated buffer reused across calls, or
a view of state a later call changes, is overwritten by the next backward:
``.grad`` then holds the wrong sum, and a gradient returned by
``torch.autograd.grad`` changes after the fact.

Per sample, the op runs twice on the same leaves from the plain run's seed
(``_plain_run``): along the plain run's cotangents, then along others. With
``torch.autograd.grad`` each backward's returned gradients must be left as
they were by the next; with ``.backward()`` into fresh leaves, ``.grad`` must
be the sum of the two gradients.
"""

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks._training_runs import (
    not_reproducible_note,
    outputs_agree,
    run_in,
    runs_agree,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.draws import repeating_normal_like
from pytest_autograd.engine.execution import as_dense, constants_only_reason, has_floating_input
from pytest_autograd.engine.outcomes import raised_by_op
from pytest_autograd.results.compare import compare_tensors, fmt, fmt_index

HINT = ("return every gradient in a new tensor (`grad * w`, `torch.empty_like(x)` filled per call), never a buffer "
        "kept across calls or a view of one: torch keeps a returned tensor that nothing else holds as the "
        "parameter's .grad and adds the next micro-batch's gradient into it, and whoever holds a gradient of "
        "torch.autograd.grad sees it change when the next backward reuses the buffer")


class Accumulation(Check):
    name = "accumulation"
    description = ("two micro-batches' backwards into .grad give the sum of their gradients, and the second "
                   "backward leaves the gradients the first returned unchanged")

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument: there is no gradient to accumulate"
        return constants_only_reason(case)

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            plain = plain_run(context, index, prepared)
            if plain.differentiable:
                _judge(context, prepared, plain)


def _judge(context, prepared, plain):
    second = [None if c is None else repeating_normal_like(tuple(c.shape), context.generator, c.device, c.dtype)
              for c in plain.drawn]
    leaves = _fresh(prepared.leaves)
    first_outputs, first = run_in(context, prepared, plain, leaves=leaves)
    kept = [g.clone() for g in first]
    if not (outputs_agree(context, plain.outputs, first_outputs) and outputs_agree(context, plain.grads, kept)):
        not_reproducible_note(context, "over two micro-batches")
        return
    _, then = run_in(context, prepared, plain, cotangents=[_copy(c) for c in second], leaves=leaves)
    then = [g.clone() for g in then]
    changed = [name for name, g, k in zip(prepared.names, first, kept) if not runs_agree(context, k, g)]
    accumulated = _accumulated(context, prepared, plain, second)
    for name, grad, a, b in zip(prepared.names, accumulated, kept, then):
        expected = a + b
        if not runs_agree(context, expected, grad):
            _fail_sum(context, name, expected, grad, changed)
    if changed:
        name = changed[0]
        position = prepared.names.index(name)
        _fail(context, f"the second backward changed the gradient w.r.t. `{name}` that the first one returned",
              f"grad {name}", kept[position], first[position], "as returned", "after the second backward",
              details=["both backwards ran with torch.autograd.grad on the same inputs; the first one's result was "
                       "changed in place by the second: it is a buffer the op reuses across calls"],
              argument=name)


def _accumulated(context, prepared, plain, second):
    """``.grad`` of fresh leaves after a backward along the plain run's cotangents, then one along ``second``."""
    leaves = _fresh(prepared.leaves)
    for cotangents in (plain.cotangents, [_copy(c) for c in second]):
        seed_generators(context.device, plain.seed)
        outputs = context.run_op(prepared, leaves)
        pairs = [(o, c) for o, c in zip(outputs, cotangents) if c is not None and o.requires_grad]
        try:
            torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
        except Exception as error:
            raise raised_by_op("backward", error) from error
    return [torch.zeros_like(leaf) if leaf.grad is None else as_dense(leaf.grad).detach() for leaf in leaves]


def _fail_sum(context, name, expected, got, changed):
    details = ["the first micro-batch's backward ran into an empty .grad, the second's into the first's result: "
               ".grad must be the sum of the gradients each returns alone"]
    if name in changed:
        details.append("the gradient the first backward returned changed when the second ran: torch kept it as "
                       ".grad, and the op wrote the second one's over it")
    _fail(context, f"after two micro-batches, .grad of `{name}` is not the sum of their gradients", f"grad {name}",
          expected, got, "sum", ".grad", details=details, argument=name)


def _fail(context, summary, label, expected, got, expected_name, got_name, details, **fields):
    mismatch = compare_tensors(expected, got, *context.tolerance(expected.dtype))
    worst = None
    if mismatch is not None and mismatch.problem is None:
        worst = f"{label}{fmt_index(mismatch.index)}: {expected_name} {fmt(mismatch.expected)}, " \
                f"{got_name} {fmt(mismatch.got)}"
    context.fail(summary, worst=worst, error=mismatch.error_line() if mismatch is not None else None,
                 details=details, hint=HINT, **fields)


def _fresh(leaves):
    return [leaf.detach().clone().requires_grad_(True) for leaf in leaves]


def _copy(tensor):
    return None if tensor is None else tensor.clone()


check = Accumulation()
