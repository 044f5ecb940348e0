"""What each Python backward returned, before the autograd engine repaired it.

The engine validates every gradient a node returns against the metadata of
the edge it flows into: it casts it to that input's dtype, sums a broadcast
gradient down to its shape and moves a 0-dim one to its device, silently.
Hooks run after that repair, so they never see what backward returned.

Every custom ``autograd.Function`` (and every ``torch.library`` op's
registered backward, which torch wraps in one) runs its backward through
``BackwardCFunction.apply``. While :func:`recording` is active that method
is wrapped, so each call's raw results are kept with the metadata the engine
expects for them: a whole model's Functions, not only the op's outermost one.
"""

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.autograd import function as _function

GENERATED_PREFIX = "GeneratedBackwardFor_"  # torch.library ops' registered backward, wrapped in a Function


@dataclass
class RawGradient:
    """One gradient a backward returned, and what the engine expects where it flows."""

    function: str  # the Function (or torch.library op) whose backward returned it
    position: int  # which of that Function's forward inputs it is the gradient of
    grad: object  # exactly what backward returned at that position
    shape: tuple  # what the engine expects: the input's shape, dtype and device
    dtype: torch.dtype
    device: torch.device
    leaf: object  # the leaf tensor it accumulates into, or None for an intermediate tensor


@contextmanager
def recording():
    """Collect a RawGradient for every gradient any Python backward returns inside the block."""
    records = []
    originals = {name: getattr(_function.BackwardCFunction, name) for name in ("apply", "apply_boxed")
                 if hasattr(_function.BackwardCFunction, name)}

    def wrap(original):
        def apply(node, *args):
            result = original(node, *args)
            try:
                records.extend(_raw_gradients(node, result))
            except Exception:  # noqa: BLE001 - a node we cannot read is not the op's fault; the engine goes on
                pass
            return result

        return apply

    for name, original in originals.items():
        setattr(_function.BackwardCFunction, name, wrap(original))
    try:
        yield records
    finally:
        for name, original in originals.items():
            setattr(_function.BackwardCFunction, name, original)


def has_python_backward(outputs):
    """True when the graph behind ``outputs`` holds a node whose backward is Python code (a Function's)."""
    seen, stack = set(), [out.grad_fn for out in outputs if out.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if getattr(type(node), "_forward_cls", None) is not None:
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


def _raw_gradients(node, result):
    forward_cls = getattr(type(node), "_forward_cls", None)
    if forward_cls is None or _torch_internal(forward_cls):
        return []
    results = result if isinstance(result, tuple) else (result,)
    needs = tuple(getattr(node, "needs_input_grad", ()) or ())
    positions = [i for i, need in enumerate(needs) if need]
    edges = [(next_node, nr) for next_node, nr in node.next_functions if next_node is not None]
    if len(positions) != len(edges):
        return []
    found = []
    for position, (next_node, nr) in zip(positions, edges):
        if position >= len(results) or not isinstance(results[position], torch.Tensor):
            continue
        metadata = next_node._input_metadata[nr]
        found.append(RawGradient(function_name(forward_cls), position, results[position], tuple(metadata.shape),
                                 metadata.dtype, metadata.device, _leaf_behind(next_node)))
    return found


def _leaf_behind(node):
    """The leaf a gradient accumulates into, seen through the clones a check passes instead of its leaves."""
    while type(node).__name__.startswith("CloneBackward") and len(node.next_functions) == 1:
        node = node.next_functions[0][0]
    return getattr(node, "variable", None) if node is not None else None


def _torch_internal(forward_cls):
    """torch's own Functions (checkpointing, ...) are not the op's code; a torch.library op's backward is."""
    module = getattr(forward_cls, "__module__", "") or ""
    return module.split(".")[0] == "torch" and not forward_cls.__name__.startswith(GENERATED_PREFIX)


def function_name(forward_cls):
    """``MyFunction``, or ``torch.ops.ns.op`` for the Function torch wraps a library op's backward in."""
    name = forward_cls.__name__
    if not name.startswith(GENERATED_PREFIX):
        return name
    forward = getattr(forward_cls, "forward", None)
    for cell in getattr(forward, "__closure__", None) or ():
        try:
            op = cell.cell_contents
        except ValueError:
            continue
        if hasattr(op, "_namespace") and hasattr(op, "_opname"):
            return f"torch.ops.{op._namespace}.{op._opname}"
    return name[len(GENERATED_PREFIX):]
