"""offload: under saved-tensor hooks (offloading to the CPU, packing a copy) gradients equal the plain run's.

Training loops short of memory offload activations with
``torch.autograd.graph.save_on_cpu()``, or compress them with their own
``saved_tensors_hooks``: every tensor saved for backward is packed when it is
saved and handed back to backward as another tensor, a copy holding the
same values, laid out contiguously (save_on_cpu packs it so). A backward
that relies on a saved tensor being the very object it saved (its address,
its storage beyond a view, an alias kept on ``ctx``), or on in-place changes
made to it after saving, reads something else there.

Per sample, forward and backward run under hooks that pack a contiguous copy
of each saved tensor, and on a device other than the CPU under
``save_on_cpu()`` too (on the CPU it hands back the very tensor), from the
plain run's seed and along its cotangents (``_plain_run``); outputs and
gradients must be the plain run's.
"""

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._training_runs import (
    first_difference,
    innermost,
    not_reproducible_note,
    output_labels,
    outputs_agree,
    reproducible,
    run_in,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import OpRaised, constants_only_reason, has_floating_input
from pytest_autograd.results.compare import compare_tensors, fmt, fmt_index

COPIES = "saved-tensor hooks that pack a copy"
HINT = ("backward must read what forward saved through ctx.saved_tensors as values only: under offloading "
        "(save_on_cpu) or any saved-tensor hooks it gets a copy, laid out contiguously, not the object forward "
        "saved; do not reach past a saved view into its base's storage, key anything on its address or identity, "
        "or change it in place after saving (through an alias kept on ctx): save every tensor backward reads, in "
        "its final values")


class Offload(Check):
    name = "offload"
    description = ("under saved-tensor hooks that pack a copy (and save_on_cpu() off the CPU) outputs and gradients "
                   "equal the plain run's")

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument: nothing is saved for a gradient"
        return constants_only_reason(case)

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            plain = plain_run(context, index, prepared)
            if not plain.differentiable:
                continue
            for where, hooks in _contexts(context.device):
                if not _judge(context, prepared, plain, where, hooks):
                    break


def _contexts(device):
    """(name, hooks) under which the op runs: copies everywhere; save_on_cpu where it moves the tensors."""
    found = [(COPIES, lambda: torch.autograd.graph.saved_tensors_hooks(_pack_copy, _unpack))]
    if not str(device).startswith("cpu"):
        pin = str(device).startswith("cuda") and torch.cuda.is_available()
        found.append(("save_on_cpu()", lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)))
    return found


def _pack_copy(tensor):
    """A copy of ``tensor`` holding its values, contiguous, as ``save_on_cpu`` packs one (any other layout or
    tensor subclass: its own clone)."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided or type(tensor) is not torch.Tensor:
        return tensor.clone()
    copy = torch.empty(tensor.size(), dtype=tensor.dtype, device=tensor.device)
    copy.copy_(tensor)
    return copy


def _unpack(copy):
    return copy


def _judge(context, prepared, plain, where, hooks):
    """Run the sample under ``hooks`` and fail on what differs; False when nothing more is judged."""
    try:
        outputs, grads = run_in(context, prepared, plain, around=hooks)
    except OpRaised as raised:
        raised = innermost(raised)
        if raised.phase == "backward":
            context.fail_raised(raised, f"under {where}, though it runs plainly", hint=HINT)
        context.note(f"offload: not judged under {where}: the op's forward raises there "
                     f"({type(raised.error).__name__}: {str(raised.error).strip().splitlines()[0]})")
        return False
    if not outputs_agree(context, plain.outputs, outputs):
        if not reproducible(context, prepared, plain):
            not_reproducible_note(context, f"under {where}")
            return False
        _fail(context, f"the op's {{}} under {where} differs from the plain run's",
              first_difference(context, plain.outputs, outputs, output_labels(outputs)), output=True)
    found = first_difference(context, plain.grads, grads, [f"grad {name}" for name in prepared.names])
    if found is not None:
        if not reproducible(context, prepared, plain):
            not_reproducible_note(context, f"under {where}")
            return False
        _fail(context, f"gradient w.r.t. `{{}}` under {where} differs from the plain run's", found)
    return True


def _fail(context, summary, found, output=False):
    label, expected, got = found
    name = label if output else label[len("grad "):]
    fields = {"output": label} if output else {"argument": name}
    mismatch = compare_tensors(expected, got, *context.tolerance(expected.dtype))
    worst = None
    if mismatch is not None and mismatch.problem is None:
        worst = f"{label}{fmt_index(mismatch.index)}: plain run {fmt(mismatch.expected)}, got {fmt(mismatch.got)}"
    context.fail(summary.format(name), worst=worst, error=mismatch.error_line() if mismatch is not None else None,
                 details=["each tensor forward saved was handed to backward as a copy holding the same values"],
                 hint=HINT, **fields)


check = Offload()
