"""checkpoint: under activation checkpointing the recompute is the first forward, and gradients are the plain run's.

``torch.utils.checkpoint`` keeps no activations: backward runs forward again
to recompute them. It restores torch's global generators for the recompute,
so dropout on them draws the same mask; nothing else is restored. A forward
that draws from a ``torch.Generator`` of its own, numpy or Python's
``random``, or that reads state it changes (a step counter, a cache keyed on
calls, a buffer update), recomputes something else: backward then
differentiates another function than the one whose output the loss saw,
silently, or torch raises a ``CheckpointError`` deep in the engine when a
saved tensor's shape changed.

Per sample, the block ``op(*inputs)`` runs under ``checkpoint(...,
use_reentrant=False)``, then under the reentrant form, from the plain run's
seed and along its cotangents (``_plain_run``). The check records each call
of the block: the recompute must give the first forward's outputs, and the
gradients must be the plain run's. An op whose plain runs differ from call
to call cannot be compared with them: noted. An op that cannot run under the
reentrant form (it raises there only) is noted, naming the error.
"""

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks._training_runs import (
    first_difference,
    innermost,
    not_reproducible_note,
    output_labels,
    outputs_agree,
    reproducible,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import OpRaised, constants_only_reason, grads_of, has_floating_input
from pytest_autograd.results.compare import compare_tensors, fmt, fmt_index

HINT = ("checkpoint runs forward again during backward and expects it to compute the same: draw random numbers from "
        "torch's global generator (checkpoint restores its state for the recompute), not a torch.Generator of your "
        "own, numpy or Python's random, or draw them outside the checkpointed region and pass them in; keep state "
        "that forward changes (a step counter, a cache, a buffer update) out of what it computes, or update it "
        "outside the checkpointed region")


class Checkpoint(Check):
    name = "checkpoint"
    description = ("under torch.utils.checkpoint (use_reentrant=False, and True) the recomputed forward equals the "
                   "first and gradients equal the plain run's")

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument: there is no gradient to recompute"
        return constants_only_reason(case)

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            plain = plain_run(context, index, prepared)
            if not plain.differentiable:
                continue
            for reentrant in (False, True):
                if not _judge(context, prepared, plain, reentrant):
                    break


def _form(reentrant):
    return f"checkpoint(use_reentrant={reentrant})"


def _judge(context, prepared, plain, reentrant):
    """Run the sample under one form of checkpoint and fail on what differs; False when the op cannot run there
    (nothing more is judged)."""
    form = _form(reentrant)
    calls = []  # each call of the checkpointed block: its first forward, then its recompute

    def block(*leaves):
        outputs = context.run_op(prepared, list(leaves))
        calls.append([out.detach().clone() for out in outputs])
        return tuple(outputs)

    seed_generators(context.device, plain.seed)
    try:
        with set_checkpoint_early_stop(False):  # the recompute runs to the end, so its outputs are seen
            outputs = list(checkpoint(block, *prepared.leaves, use_reentrant=reentrant))
            grads = [g.detach() for g in grads_of(outputs, prepared.leaves, plain.cotangents)]
    except OpRaised as raised:
        return _raised(context, innermost(raised), form, reentrant, calls)
    labels = output_labels(calls[0])
    if len(calls) > 1:
        _fail_if_recomputed_otherwise(context, form, calls[0], calls[1], labels)
    if not outputs_agree(context, plain.outputs, calls[0]):
        if reproducible(context, prepared, plain):
            found = first_difference(context, plain.outputs, calls[0], labels)
            _fail(context, f"under {form} the forward's {found[0]} differs from the plain run's", found,
                  "plain run", form, output=found[0])
        not_reproducible_note(context, f"against the plain run under {form}")
        return True  # the other form's recompute is still judged against its own first forward
    found = first_difference(context, plain.grads, grads, [f"grad {name}" for name in prepared.names])
    if found is not None:
        name = found[0][len("grad "):]
        _fail(context, f"gradient w.r.t. `{name}` under {form} differs from the plain run's", found,
              "plain run", form, argument=name,
              details=[f"the checkpointed block's recompute gave the first forward's outputs, so what differs is "
                       "a tensor forward saved (or state it keeps on ctx) that the recompute computed otherwise"])
    return True


def _fail_if_recomputed_otherwise(context, form, first, again, labels):
    found = first_difference(context, first, again, labels)
    if found is None:
        return
    _fail(context, f"under {form} the forward recomputed during backward differs from the first forward: "
                   f"{found[0]} changed", found, "first forward", "recompute", output=found[0],
          details=["backward differentiates the recomputed forward, so the gradients are not those of the output "
                   "the loss was computed from"])


def _fail(context, summary, found, expected_name, got_name, details=(), **fields):
    label, expected, got = found
    mismatch = compare_tensors(expected, got, *context.tolerance(expected.dtype))
    if mismatch is not None and mismatch.problem is None:
        worst = (f"{label}{fmt_index(mismatch.index)}: {expected_name} {fmt(mismatch.expected)}, "
                 f"{got_name} {fmt(mismatch.got)}")
    else:
        worst = f"{label}: {expected_name} shape {list(expected.shape)}, {got_name} shape {list(got.shape)}"
    context.fail(summary, worst=worst, error=mismatch.error_line() if mismatch is not None else None,
                 details=list(details), hint=HINT, **fields)


def _raised(context, raised, form, reentrant, calls):
    """An error under checkpoint that the plain run did not meet: torch's recompute check (CheckpointError) or the
    op's backward under the non-reentrant form fails; the forward raising, or anything under the reentrant
    form, is a context the op cannot run in: noted."""
    error = raised.error
    during_backward = raised.phase == "backward" or bool(calls)  # a forward raising after the first: the recompute
    if isinstance(error, torch.utils.checkpoint.CheckpointError):
        context.fail(f"under {form} torch's recompute check failed: the forward recomputed during backward saved "
                     "other tensors than the first forward", details=[f"CheckpointError: {_torch_message(error)}"],
                     hint=HINT)
    if during_backward and not reentrant:
        context.fail_raised(raised, f"under {form}, though it runs plainly",
                            details=["raised during backward" + (", in the recomputed forward" if calls else "")],
                            hint=HINT)
    context.note(f"checkpoint: not judged under {form}: the op's {raised.phase} raises there "
                 f"({type(error).__name__}: {_first_line(error)})")
    return False


def _torch_message(error):
    """torch's message up to its tips: what differed, on one line."""
    text = str(error).split("\n\n")[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip() not in ("", "."))


def _first_line(error):
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


check = Checkpoint()
