"""grad_metadata: backward returns gradients with the dtype, device and shape of their inputs.

The autograd engine quietly repairs what backward returns: it casts a
float32 gradient to the float64 input's dtype and sums a broadcast gradient
down to the input's shape. The cast hides a real loss of precision, so this
check calls the Function's backward itself (through the output's grad_fn)
and looks at the raw gradients before the engine touches them.

A backward that computes in float32 and casts back before returning leaves
no trace in the metadata, but it leaves one in the values: every element
of a float64 gradient is then exactly a float32 number, which genuine
float64 arithmetic on a random float64 cotangent practically never gives.
That fingerprint is checked for every op (on the engine's gradients when
the op is not an autograd.Function).
"""

import warnings

import torch

from pytest_autograd.checks._float64_support import float64_plan, sample_dtype
from pytest_autograd.checks._hygiene import HygieneWarning, call_with, function_node
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    constants_only_reason,
    grads_of,
    has_floating_input,
    random_cotangents,
)
from pytest_autograd.results.compare import dtype_label

FINGERPRINT_MIN_ELEMENTS = 4  # non-zero gradient elements needed before the float32 fingerprint counts

PRECISION_HINT = ("compute the gradient in the input's dtype: drop .float() / .to(torch.float32) and float32 "
                  "buffers or kernels from backward (cast only where a lower precision is really intended)")


class GradMetadata(Check):
    name = "grad_metadata"
    description = "raw gradients from backward have their input's dtype, device and shape (no float32 in float64)"
    options = {"dtypes": None}  # the dtypes the op supports; without float64 it is judged in the best one

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return constants_only_reason(case)

    def run(self, context):
        warned = set()
        for index, sample in context.samples():
            # An op that cannot run in float64 (or computes and returns float32 by design) is checked in its
            # own dtype only: float32 gradients are then what it promises, not a silent loss.
            wanted = (torch.float64, sample_dtype(context, sample))
            if float64_plan(context, sample) is not None:
                wanted = wanted[1:]
            for dtype in dict.fromkeys(d for d in wanted if d is not None):
                prepared = context.prepare(sample, dtype=dtype)
                if not prepared.leaves:
                    continue
                args, kwargs = prepared.call_args()
                call = call_with(context.case, args, kwargs)
                if context.case.is_function:
                    self._check_raw(context, prepared, call, warned)
                else:
                    self._check_engine(context, prepared, call)
            context.dtype = None

    def _check_raw(self, context, prepared, call, warned):
        """Call the Function's backward via its grad_fn and inspect what it returns."""
        node = function_node(context.case, call.outputs)
        if node is None:
            return
        grad_outputs = _node_grad_outputs(call.result, context.generator)
        try:
            with torch.no_grad():
                raw = node.apply(*grad_outputs)
        except Exception as error:
            raise OpRaised("backward", error) from error
        raw = raw if isinstance(raw, tuple) else (raw,)
        positions = _input_positions(context.case, prepared)
        for name, slot, leaf in zip(prepared.names, prepared.slots, prepared.leaves):
            position = positions.get(slot)
            if position is None or position >= len(raw) or raw[position] is None:
                continue
            grad = raw[position]
            if not isinstance(grad, torch.Tensor):
                context.fail(f"backward returns a {type(grad).__name__} as the gradient of `{name}`, not a tensor",
                             argument=name, hint="return a tensor shaped like the input, or None")
            _check_metadata(context, name, leaf, grad, warned)
            _check_fingerprint(context, name, leaf, grad, "backward returns")

    def _check_engine(self, context, prepared, call):
        """Not a Function: only the engine's gradients are visible; check the float32 fingerprint."""
        if prepared.leaves[0].dtype != torch.float64:
            return
        cotangents = random_cotangents(call.outputs, context.generator)
        grads = grads_of(call.outputs, prepared.leaves, cotangents)
        for name, leaf, grad in zip(prepared.names, prepared.leaves, grads):
            _check_fingerprint(context, name, leaf, grad, "the op's backward gives")


def _node_grad_outputs(result, generator):
    """One incoming gradient per forward output, as the engine would pass them (zeros where not differentiable)."""
    items = result if isinstance(result, tuple) else (result,)
    grads = []
    for item in items:
        if not isinstance(item, torch.Tensor):
            grads.append(None)
        elif item.is_floating_point() and item.requires_grad:
            grads.append(random_cotangents([item], generator)[0])
        else:
            grads.append(torch.zeros_like(item))
    return grads


def _input_positions(case, prepared):
    """slot -> position of that argument among the Function's inputs (keywords by their name)."""
    positions = {}
    for slot in prepared.slots:
        if isinstance(slot, int):
            positions[slot] = slot
        elif slot in case.arg_names:
            positions[slot] = case.arg_names.index(slot)
    return positions


def _check_metadata(context, name, leaf, grad, warned):
    expected, got = leaf.dtype, grad.dtype
    if got != expected:
        loss = ""
        if expected.is_floating_point and got.is_floating_point and torch.finfo(got).eps > torch.finfo(expected).eps:
            loss = f": the {dtype_label(expected)} gradient then carries only {dtype_label(got)} precision"
        context.fail(f"backward returns the gradient of `{name}` as {dtype_label(got)}, but `{name}` is {dtype_label(expected)}; "
                     f"autograd casts it silently{loss}", argument=name,
                     details=[f"raw gradient: {_describe(grad)}; input: {_describe(leaf)}"], hint=PRECISION_HINT)
    if grad.device != leaf.device:
        context.fail(f"backward returns the gradient of `{name}` on {grad.device}, but `{name}` is on {leaf.device}",
                     argument=name, hint="create gradients on the input's device (e.g. torch.zeros_like(input), "
                                         "or device=input.device)")
    if tuple(grad.shape) != tuple(leaf.shape):
        if _expandable(leaf.shape, grad.shape):
            if name in warned:
                return
            warned.add(name)
            warnings.warn(HygieneWarning(
                f"{context.case.name}: backward returns the gradient of `{name}` with shape {list(grad.shape)} "
                f"for an input of shape {list(leaf.shape)}; autograd sums it over the broadcast dimensions. "
                "Legal, but reducing it in backward saves memory and states the intent."), stacklevel=3)
        else:
            context.fail(f"backward returns the gradient of `{name}` with shape {list(grad.shape)}, "
                         f"which cannot be summed to the input's shape {list(leaf.shape)}", argument=name,
                         hint="return a gradient of exactly the input's shape")


def _check_fingerprint(context, name, leaf, grad, who):
    if leaf.dtype != torch.float64 or grad.dtype != torch.float64:
        return
    values = grad.detach()
    values = values[(values != 0) & values.isfinite()]
    if values.numel() < FINGERPRINT_MIN_ELEMENTS:
        return
    if bool((values.to(torch.float32).to(torch.float64) == values).all()):
        context.fail(f"{who} a float64 gradient for `{name}` whose {values.numel()} non-zero values are all "
                     "exactly float32 numbers: backward computes in float32 and casts back", argument=name,
                     details=[("float64 arithmetic on a random float64 grad_output practically never lands on "
                              "float32 values; float32 arithmetic always does")], hint=PRECISION_HINT)


def _expandable(input_shape, grad_shape):
    try:
        return tuple(torch.broadcast_shapes(tuple(input_shape), tuple(grad_shape))) == tuple(grad_shape)
    except RuntimeError:
        return False


def _describe(tensor):
    return f"{dtype_label(tensor.dtype)}{list(tensor.shape)} on {tensor.device}"


check = GradMetadata()
