"""leak: nothing the op creates outlives its outputs, and backward frees what forward saved.

Two classic mistakes, both from keeping tensors as ``ctx`` attributes instead
of ``ctx.save_for_backward``:

* ``ctx.output = output`` closes a reference cycle (output -> grad_fn = ctx
  -> output). Reference counting never frees it: the output, the graph and
  everything it holds stay alive until Python's cyclic garbage collector
  happens to run, which device memory pressure does not trigger.
* ``ctx.input = input`` makes no cycle (everything is freed once the output
  is dropped), but the input outlives backward for as long as the output
  does, where ``save_for_backward`` frees it when backward ends (and lets
  autograd detect in-place changes to it).

The check runs forward and backward with the garbage collector disabled,
watches weak references to the outputs, the ctx and the tensors the op was
given, then drops its own references and reports what is still alive.
"""

import gc
import warnings
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import (
    HygieneWarning,
    call_with,
    cuda_allocated,
    describe,
    fmt_bytes,
    function_node,
    nbytes,
    shares_storage,
    tensor_arguments,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.checks.growth import CreatedTensors
from pytest_autograd.engine.execution import grads_of, output_label, random_cotangents

SAVE_HINT = ("save tensors the backward needs with ctx.save_for_backward(...) and read them back with "
             "ctx.saved_tensors; keep only non-tensors (shapes, flags, numbers) as ctx attributes")


@dataclass
class Attribute:
    """A tensor stored as a plain ctx attribute, and what it is to the op."""

    name: str
    relation: str  # "output 0", "input `x`", or "intermediate"
    size: int
    description: str
    ref: object


@dataclass
class Probe:
    """What one forward + backward left alive, at each stage."""

    attributes: list = field(default_factory=list)
    held_after_backward: list = field(default_factory=list)  # input names alive after backward
    tracked: list = field(default_factory=list)  # (label, weakref, bytes)
    alive_after_drop: list = field(default_factory=list)  # labels
    alive_after_collect: list = field(default_factory=list)
    saved: list = field(default_factory=list)  # relations ("input `x`", "output") saved with save_for_backward
    device_bytes: int = None  # still allocated on the device after dropping (None off-GPU)


class Leak(Check):
    name = "leak"
    description = "no reference cycle keeps outputs alive; no input or output is held on ctx past backward"

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            probe = _probe(context, prepared)
            _report_cycle(context, probe)
            _report_held(context, probe)
            _warn_intermediates(context, probe)


def _probe(context, prepared):
    probe = Probe()
    enabled = gc.isenabled()
    gc.disable()
    try:
        before = cuda_allocated(context.device)
        _run_and_drop(context, prepared, probe)
        probe.alive_after_drop = [label for label, ref, _ in probe.tracked if ref() is not None]
        after = cuda_allocated(context.device)
        if before is not None and after is not None:
            probe.device_bytes = max(0, after - before)
        if probe.alive_after_drop:
            gc.collect()
            probe.alive_after_collect = [label for label, ref, _ in probe.tracked if ref() is not None]
    finally:
        if enabled:
            gc.enable()
    return probe


def _run_and_drop(context, prepared, probe):
    """Forward, backward, then drop every reference this frame holds; fill ``probe`` with weak references."""
    case = context.case
    args, kwargs = prepared.call_args()
    arguments = tensor_arguments(case, args, kwargs)
    created = None if case.is_function else CreatedTensors()
    with created if created is not None else nullcontext():
        call = call_with(case, args, kwargs)
    outputs = call.outputs
    count = len(outputs)
    node = function_node(case, outputs)
    probe.attributes = _ctx_tensors(node, arguments, outputs)
    if created is not None:
        # A Function found inside a wrapper or a module: its own arguments are not the op's. A tensor that existed
        # before the call (a cache the module holds, handed to the Function) outlives it by design; only what the
        # call made is the op's to free.
        made = {id(tensor) for tensor in created.alive()}
        probe.attributes = [a for a in probe.attributes if a.relation != "intermediate" or id(a.ref()) in made]
    probe.saved = _saved_relations(node, arguments, outputs)
    probe.tracked = [(output_label(k, count), weakref.ref(out), nbytes(out)) for k, out in enumerate(outputs)]
    if node is not None:
        probe.tracked.append((f"the autograd node {type(node).__name__} (the ctx)", weakref.ref(node), 0))
    aliased = {name for _, name, tensor in arguments if any(shares_storage(tensor, out) for out in outputs)}
    inputs = [(name, weakref.ref(tensor), nbytes(tensor)) for _, name, tensor in arguments if name not in aliased]
    probe.tracked += [(f"the op's input `{name}`", ref, size) for name, ref, size in inputs]
    probe.tracked += [(f"ctx.{a.name}", a.ref, a.size) for a in probe.attributes if "output" not in a.relation]
    cotangents = random_cotangents(outputs, context.generator, repeating=True)
    # Only real floating outputs get a cotangent: with none (e.g. a complex output) backward never runs, and
    # the graph rightly keeps what forward saved until the outputs are dropped, which is no leak.
    ran_backward = prepared.leaves and any(out.requires_grad and c is not None for out, c in zip(outputs, cotangents))
    if ran_backward:
        grads_of(outputs, prepared.leaves, cotangents)
    del call, args, kwargs, arguments, cotangents, node
    if ran_backward:
        probe.held_after_backward = [name for name, ref, _ in inputs if ref() is not None]
    del outputs


def _ctx_tensors(node, arguments, outputs):
    """Tensors kept as plain attributes of the Function's ctx, with what each one is."""
    if node is None:
        return []
    found = []
    count = len(outputs)
    for attribute, value in _tensor_attributes(node):
        relation = "intermediate"
        for k, out in enumerate(outputs):
            if value is out or shares_storage(value, out):
                relation = output_label(k, count)
                break
        else:
            for _, name, tensor in arguments:
                if value is tensor or shares_storage(value, tensor):
                    relation = f"input `{name}`"
                    break
        found.append(Attribute(attribute, relation, nbytes(value), describe(value), weakref.ref(value)))
    return found


def _saved_relations(node, arguments, outputs):
    """What the op saved with ctx.save_for_backward: "input `x`" or an output label, for each saved tensor.

    Only labels are kept: holding the unpacked tensors would itself keep them alive.
    """
    if node is None:
        return []
    try:
        saved = list(node.saved_tensors)
    except RuntimeError:  # already freed, or nothing saved
        return []
    relations = []
    count = len(outputs)
    for value in saved:
        if not isinstance(value, torch.Tensor):
            continue
        for k, out in enumerate(outputs):
            if value is out or shares_storage(value, out):
                relations.append(output_label(k, count))
                break
        else:
            for _, name, tensor in arguments:
                if value is tensor or shares_storage(value, tensor):
                    relations.append(f"input `{name}`")
                    break
    del saved
    return relations


def _already_saved_hint(labels):
    listed = ", ".join(labels)
    return (f"{listed} {'is' if len(labels) == 1 else 'are'} already saved with ctx.save_for_backward, so something "
            "else holds it: a global list or cache, a closure, a non-tensor ctx attribute (a list, dict or object) "
            "that contains it, or an output that is a view of it; drop that reference")


def _tensor_attributes(node):
    """(name, tensor) for tensors on ctx, also inside a list, tuple or dict attribute (``ctx.saved[0]``)."""
    for attribute, value in list(vars(node).items()):
        if isinstance(value, torch.Tensor):
            yield attribute, value
        elif isinstance(value, (list, tuple)):
            yield from ((f"{attribute}[{i}]", item) for i, item in enumerate(value) if isinstance(item, torch.Tensor))
        elif isinstance(value, dict):
            yield from ((f"{attribute}[{key!r}]", item) for key, item in value.items()
                        if isinstance(item, torch.Tensor))


def _report_cycle(context, probe):
    if not probe.alive_after_drop:
        return
    holders = [a for a in probe.attributes if "output" in a.relation]
    survivors = ", ".join(probe.alive_after_drop)
    size = sum(size for label, _, size in probe.tracked if label in probe.alive_after_drop)
    details = [f"still alive: {survivors}"]
    if probe.device_bytes:
        details.append(f"{fmt_bytes(probe.device_bytes)} still allocated on {context.device}")
    else:
        details.append(f"tensors kept alive: {fmt_bytes(size)}")
    if probe.alive_after_collect:
        details.append(f"still alive even after gc.collect(): {', '.join(probe.alive_after_collect)} "
                       "(something outside the graph, e.g. a global list or cache, holds it)")
    else:
        details.append("gc.collect() frees them: only Python's cyclic garbage collector can")
    if holders:
        attribute = holders[0]
        summary = (f"ctx.{attribute.name} holds the op's {attribute.relation}: {attribute.relation} -> grad_fn "
                   f"(ctx) -> ctx.{attribute.name} -> {attribute.relation} is a reference cycle, so the "
                   "outputs and the graph outlive their last reference")
        hint = (f"save the output with ctx.save_for_backward(...) and read it from ctx.saved_tensors instead of "
                f"keeping it in ctx.{attribute.name}: saved tensors hold the output without a cycle")
    else:
        verb = "outlives" if len(probe.alive_after_drop) == 1 else "outlive"
        summary = f"{survivors} {verb} the last reference to the outputs"
        alive = set(probe.alive_after_drop)
        saved = [f"`{label.split('`')[1]}`" if label.startswith("input") else label for label in probe.saved
                 if label in alive or f"the op's {label}" in alive]
        hint = (_already_saved_hint(saved) if saved else
                "a reference cycle through ctx or the graph, or a global that keeps outputs; " + SAVE_HINT)
    context.fail(summary, details=details, hint=hint, output=holders[0].relation if holders else None)


def _report_held(context, probe):
    if not probe.held_after_backward:
        return
    names = probe.held_after_backward
    holders = [a for a in probe.attributes if any(a.relation == f"input `{name}`" for name in names)]
    size = sum(size for label, _, size in probe.tracked if any(label.endswith(f"`{name}`") for name in names))
    quoted = ", ".join(f"`{name}`" for name in names)
    if holders:
        by = ", ".join(f"ctx.{a.name}" for a in holders)
        summary = (f"{by} hold{'s' if len(holders) == 1 else ''} the op's input{'s' if len(names) > 1 else ''} "
                   f"{quoted} as plain ctx attributes: they stay alive after backward for as long as the output does")
    else:
        summary = f"the op's input{'s' if len(names) > 1 else ''} {quoted} stay alive after backward"
    details = [f"kept after backward: {fmt_bytes(size)} ({', '.join(a.description for a in holders) or quoted})",
               "no reference cycle: they are freed once the output is dropped"]
    context.fail(summary, argument=", ".join(names), details=details,
                 hint=(f"use ctx.save_for_backward({', '.join(_input_name(a) for a in holders)}) and "
                       "ctx.saved_tensors: "
                       "backward then frees them when it ends, and autograd detects in-place changes to them")
                 if holders else _held_hint(names, probe.saved))


def _held_hint(names, saved):
    """The hint for inputs alive after backward with no ctx attribute holding them."""
    already = [f"`{name}`" for name in names if f"input `{name}`" in saved]
    return _already_saved_hint(already) if already else SAVE_HINT


def _input_name(attribute):
    return attribute.relation.split("`")[1]


def _warn_intermediates(context, probe):
    kept = [a for a in probe.attributes if a.relation == "intermediate"]
    if not kept:
        return
    listed = ", ".join(f"ctx.{a.name} ({a.description}, {fmt_bytes(a.size)})" for a in kept)
    one = len(kept) == 1
    warnings.warn(HygieneWarning(
        f"{context.case.name}: {listed} stay{'s' if one else ''} alive after backward until the output is dropped; "
        f"ctx.save_for_backward would free {'it' if one else 'them'} when backward ends"), stacklevel=2)


check = Leak()
