"""mutation: forward leaves its arguments alone unless it declares the change; backward writes nothing it was given.

An undeclared in-place write corrupts the caller's tensor while autograd
keeps its old history, so gradients through it are silently wrong or fail
much later in a version check. ``grad_output`` belongs to the caller (it may
be the ``grad_outputs`` of ``torch.autograd.grad`` or shared with a sibling
branch), so writing into it corrupts someone else's data; so do writes to
the outputs or saved tensors in backward. Non-tensor arguments (a list of
paddings) count too. Buffers updated on purpose are declared with
``mutates=`` on the marker (``ctx.mark_dirty`` / returning the argument, or
``mutates_args`` for a torch.library op, declare it too).
"""

import inspect

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import (
    call_with,
    changed_elements,
    function_node,
    tensor_arguments,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import grads_of, output_label, random_cotangents
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import fmt, fmt_index


class Mutation(Check):
    name = "mutation"
    description = ("forward modifies no input unless declared (ctx.mark_dirty, mutates=); backward modifies no "
                   "input, output, saved tensor or grad_output")
    options = {"mutates": None}

    def run(self, context):
        case = context.case
        declared = declared_mutations(case) | declared_by_marker(case)
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            args, kwargs = prepared.call_args()
            call = _check_forward(context, declared, args, kwargs)
            _check_backward(context, prepared, call, declared)


def _check_forward(context, declared, args, kwargs):
    """Call forward; fail on a change to an argument that is neither returned nor declared. Returns the Call."""
    case = context.case
    arguments = tensor_arguments(case, args, kwargs)
    plain = plain_arguments(case, args, kwargs)
    before = [_snapshot(tensor) for _, _, tensor in arguments]
    call = call_with(case, args, kwargs)
    undeclared = [(name, tensor, snapshot) for (slot, name, tensor), snapshot in zip(arguments, before)
                  if not any(out is tensor for out in call.outputs) and slot not in declared and name not in declared]
    changed = [name for name, tensor, snapshot in undeclared if _changed(snapshot, tensor)]
    for name, tensor, snapshot in undeclared:
        if name in changed:  # compared once above; the report compares again only for what changed
            _fail_if_changed(context, snapshot, tensor, name, "forward", "its argument",
                             _forward_hint(case, name, changed))
    for slot, name, value, copy in plain:
        if slot not in declared and name not in declared:
            _fail_if_plain_changed(context, copy, value, name, "forward")
    return call


def _check_backward(context, prepared, call, declared):
    """Run backward; fail on a change to grad_output, an argument, an output or a saved tensor.

    An argument declared with ``mutates=`` may be overwritten by backward too (a memory-saving backward
    that writes the gradients into the saved inputs, as Liger's kernels do), and so may what forward saved
    of it."""
    case = context.case
    arguments = tensor_arguments(case, call.args, call.kwargs)
    after_forward = [_snapshot(tensor) for _, _, tensor in arguments]
    plain = plain_arguments(case, call.args, call.kwargs)
    outputs_after_forward = [_snapshot(out) for out in call.outputs]
    saved = saved_tensors(case, call.outputs)
    saved_after_forward = [_snapshot(tensor) for _, tensor in saved]
    cotangents = random_cotangents(call.outputs, context.generator, repeating=True)
    cotangent_snapshots = [None if c is None else _snapshot(c) for c in cotangents]
    if prepared.leaves and any(out.requires_grad for out in call.outputs):
        grads_of(call.outputs, prepared.leaves, cotangents)
    count = len(call.outputs)
    grad_names = backward_argument_names(case, count)
    for k, (cotangent, snapshot) in enumerate(zip(cotangents, cotangent_snapshots)):
        if cotangent is not None:
            _fail_if_changed(context, snapshot, cotangent, grad_names[k], "backward", "its incoming gradient",
                             GRAD_OUTPUT_HINT.format(name=grad_names[k]), output=output_label(k, count))
    mutable = [tensor for slot, name, tensor in arguments if slot in declared or name in declared]
    for (slot, name, tensor), snapshot in zip(arguments, after_forward):
        if slot in declared or name in declared:
            continue
        _fail_if_changed(context, snapshot, tensor, name, "backward", "the op's input",
                         f"backward must not write to the op's inputs: compute a new tensor from `{name}` "
                         "instead of updating it in place, or, if it overwrites the input on purpose to save "
                         f"memory, declare it on the marker: mutates=(\"{name}\",)")
    for slot, name, value, copy in plain:
        _fail_if_plain_changed(context, copy, value, name, "backward")
    for k, (out, snapshot) in enumerate(zip(call.outputs, outputs_after_forward)):
        label = output_label(k, count)
        _fail_if_changed(context, snapshot, out, label, "backward", "the op's output", BACKWARD_OUTPUT_HINT,
                         output=label, argument=None)
    for (label, tensor), snapshot in zip(saved, saved_after_forward):
        if any(_same_memory(tensor, argument) for argument in mutable):
            continue
        _fail_if_changed(context, snapshot, tensor, label, "backward", "the saved tensor", BACKWARD_SAVED_HINT,
                         argument=None)


def _same_memory(a, b):
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return False


BACKWARD_OUTPUT_HINT = ("backward must not write to what forward returned (e.g. `y.mul_(grad)` on a saved output): "
                        "the caller still holds the output, and double backward reads it again; compute a new "
                        "tensor (`grad * y`)")
BACKWARD_SAVED_HINT = ("backward must not write to what forward saved: a second backward (retain_graph=True) or "
                       "double backward reads it again; compute a new tensor instead of updating it in place")


GRAD_OUTPUT_HINT = ("compute a new tensor (`{name} * 2`) instead of updating it in place (`{name}.mul_(2)`): "
                    "the gradient belongs to the caller and may be shared with other branches of the graph")


def plain_arguments(case, args, kwargs):
    """(slot, name, value, copy) for every mutable non-tensor argument (a list, dict, set or bytearray)."""
    import copy

    found = []
    for slot, value in list(enumerate(args)) + list(kwargs.items()):
        if isinstance(value, (list, dict, set, bytearray)):
            try:
                snapshot = copy.deepcopy(value)
                comparable = bool(snapshot == value)
            except Exception:  # a value that cannot be copied or compared cannot be judged
                continue
            if comparable:
                found.append((slot, case.arg_name(slot), value, snapshot))
    return found


def _fail_if_plain_changed(context, before, now, name, phase):
    try:
        same = bool(before == now)
    except Exception:
        return
    if same:
        return
    undeclared = " without declaring it" if phase == "forward" else ""
    kind = type(now).__name__
    context.fail(f"{phase} modified its argument `{name}` (a {kind}) in place{undeclared}: {before!r:.80} -> {now!r:.80}",
                 argument=name,
                 details=["the caller's object changed, so every later call with it gets different values "
                          "(e.g. paddings reversed on every second call)"],
                 hint=f"work on a copy (`{name} = {kind}({name})`) instead of changing the caller's {kind}"
                      + (f", or declare the change on the marker: mutates=(\"{name}\",)" if phase == "forward" else ""))


def saved_tensors(case, outputs):
    """("ctx.saved_tensors[i]" or "ctx.<attribute>", tensor) for what a Function's forward kept for backward."""
    node = function_node(case, outputs)
    if node is None:
        return []
    found = []
    try:
        found += [(f"ctx.saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors) if t is not None]
    except RuntimeError:  # already freed, or saved tensors of an unusual kind
        pass
    for attribute, value in list(vars(node).items()):
        if isinstance(value, torch.Tensor):
            found.append((f"ctx.{attribute}", value))
    return found


def _snapshot(tensor):
    return tensor._version, tensor.detach().clone()


def _changed(snapshot, tensor):
    version, values = snapshot
    return tensor._version != version or changed_elements(values, tensor.detach()) > 0


def _fail_if_changed(context, snapshot, tensor, name, phase, what, hint, **fields):
    version, values = snapshot
    now = tensor.detach()
    changed = changed_elements(values, now)
    bumped = tensor._version != version
    if not changed and not bumped:
        return
    undeclared = " without declaring it" if phase == "forward" else ""
    if values.shape != now.shape:
        summary = (f"{phase} resized {what} `{name}` in place{undeclared}: shape {list(values.shape)} -> "
                   f"{list(now.shape)}")
        worst = None
    elif changed:
        summary = (f"{phase} modified {what} `{name}` in place{undeclared}: "
                   f"{changed} of {values.numel()} elements changed")
        differ = (values != now) & ~(values.isnan() & now.isnan()) if values.is_floating_point() else values != now
        position = tuple(int(i) for i in differ.nonzero()[0]) if values.dim() else ()
        worst = f"{name}{fmt_index(position)}: before {fmt(values[position].item())}, after {fmt(now[position].item())}"
    else:
        summary = (f"{phase} wrote to {what} `{name}` in place{undeclared} (its version counter went "
                   f"{version} -> {tensor._version}, though no value changed)")
        worst = None
    fields.setdefault("argument", name)
    context.fail(summary, worst=worst, hint=hint, **fields)


def _forward_hint(case, name, changed=()):
    names = ", ".join(f'"{n}"' for n in (changed or [name]))
    buffer = (f"; for a buffer the op updates on purpose (running statistics), declare it on the marker: "
              f"mutates=({names}{',' if len(changed) < 2 else ''})")
    if name in case.constant_slots:
        buffer += " (constants= only says it is not differentiated; it does not allow changing it)"
    if case.is_function:
        return (f"work on a copy (`{name} = {name}.clone()`), or declare the in-place update with "
                f"ctx.mark_dirty({name}) and return `{name}` itself{buffer}")
    if _schema(case.op) is not None:
        return f"work on a copy, or declare the write with mutates_args=[\"{name}\"] on the custom op"
    return f"work on a copy of `{name}`, or return the modified `{name}` itself so the caller sees the change{buffer}"


def declared_by_marker(case):
    """Slots and names in ``mutates=`` on the marker: arguments the op may change in place."""
    declared = case.option("mutates")
    if declared is None:
        return set()
    entries = [declared] if isinstance(declared, (str, int)) else list(declared)
    keywords = {key for sample in case.samples for key in sample.kwargs}
    slots = set()
    for entry in entries:
        if isinstance(entry, int) and not isinstance(entry, bool):
            slots.update({entry, case.arg_name(entry)})
        elif isinstance(entry, str) and (entry in case.arg_names or entry in keywords):
            slots.add(entry)
            if entry in case.arg_names:
                slots.add(case.arg_names.index(entry))
        else:
            known = ", ".join(case.arg_names) or "unknown (the op's signature cannot be read; use positions)"
            raise UsageProblem(f"mutates={declared!r} names {entry!r}, which is not an argument of the op; its "
                               f"arguments are: {known}.")
    return slots


def declared_mutations(case):
    """Argument names a torch.library op declares it writes (``mutates_args`` / ``Tensor(a!)``)."""
    schema = _schema(case.op)
    if schema is None:
        return set()
    return {argument.name for argument in schema.arguments
            if argument.alias_info is not None and argument.alias_info.is_write}


def _schema(op):
    for candidate in (op, getattr(op, "_opoverload", None), getattr(op, "default", None)):
        schema = getattr(candidate, "_schema", None)
        if schema is not None and hasattr(schema, "arguments"):
            return schema
    return None


def backward_argument_names(case, count):
    """The names backward gives its incoming gradients (``grad_output`` when unknown)."""
    default = ["grad_output"] if count == 1 else [f"grad_output{k}" for k in range(count)]
    if not case.is_function:
        return default
    try:
        parameters = list(inspect.signature(case.op.backward).parameters.values())[1:]
    except (TypeError, ValueError):
        return default
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < count:
        return default
    return names[:count]


check = Mutation()
