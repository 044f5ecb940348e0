"""Shared pieces of the hygiene checks (mutation, leak, grad_metadata, ...).

These checks must see the exact tensors the op was given and the exact
outputs it returned, so they call the op here instead of through
``CheckContext.run_op``, which hides the clones it makes.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.engine.execution import flatten_outputs, grads_of, random_cotangents
from pytest_autograd.engine.outcomes import raised_by_op
from pytest_autograd.results.compare import unravel


class HygieneWarning(UserWarning):
    """Something legal but worth knowing (e.g. a gradient the engine has to sum)."""


@dataclass
class Call:
    """One call of the op: the exact arguments passed and what came back."""

    args: list
    kwargs: dict
    result: object
    outputs: list


def call_with(case, args, kwargs, fn=None):
    """Call the op (or ``fn``) on exactly these arguments."""
    try:
        result = (fn or case.call)(*args, **kwargs)
    except Exception as error:  # reported as the op's own failure
        raise raised_by_op("forward", error) from error
    return Call(args, kwargs, result, flatten_outputs(result))


def tensor_arguments(case, args, kwargs):
    """(slot, name, tensor) for every tensor argument of one call."""
    found = [(position, case.arg_name(position), value) for position, value in enumerate(args)
             if isinstance(value, torch.Tensor)]
    found += [(key, key, value) for key, value in kwargs.items() if isinstance(value, torch.Tensor)]
    return found


def max_difference(a, b):
    """Largest |a - b| (NaN matching NaN, equal infinities matching), its index and the count differing."""
    if a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b)):
        return 0.0, None, 0  # bitwise equal (the usual verdict of two runs): one pass, nothing allocated
    a, b = _real_view(a), _real_view(b)
    a = a.detach().to("cpu", torch.float64)
    b = b.detach().to("cpu", torch.float64)
    if a.numel() == 0:
        return 0.0, None, 0
    same = (a == b) | (a.isnan() & b.isnan())
    diff = (a - b).abs()
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    count = int((~same).sum())
    if count == 0:
        return 0.0, None, 0
    flat = int(torch.argmax(diff))
    index = unravel(flat, a.shape)
    return float(diff.reshape(-1)[flat]), index, count


def _real_view(tensor):
    """A complex tensor as (..., 2) real and imaginary parts: casting it to float64 would drop the imaginary part."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def changed_elements(before, after):
    """How many elements differ between two snapshots of one tensor (NaN == NaN)."""
    if before.shape != after.shape:
        return before.numel()
    if before.dtype == after.dtype and before.device == after.device and torch.equal(before, after):
        return 0  # bitwise equal, the usual case: one pass, nothing allocated (NaN fails it: counted below)
    if before.is_floating_point() or before.is_complex():
        same = (before == after) | (before.isnan() & after.isnan())
    else:
        same = before == after
    return int((~same).sum())


def shares_storage(a, b):
    """True when ``a`` and ``b`` are views of the same memory."""
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.device == b.device
    except (RuntimeError, NotImplementedError):  # e.g. sparse or functional tensors
        return a is b


def nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def fmt_bytes(count):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} bytes"


def describe(tensor):
    return f"tensor{list(tensor.shape)}:{str(tensor.dtype).replace('torch.', '')}"


def quoted(names):
    return ", ".join(f"`{name}`" for name in names)


NODES_SEARCHED = 64  # graph nodes looked at, outputs first, for a custom Function's ctx behind a wrapper


def function_node(case, outputs):
    """The autograd node (the ``ctx``) of the op's own Function call, or None.

    For an op given as the Function class, its own node. For any other op
    (``Fn.apply``, a wrapper function around it, a module) the first custom
    Function's node in the graph the call made, nearest the outputs first: the
    ctx its backward reads is the same, whichever way the marker names the op.
    """
    if case.is_function:
        for output in outputs:
            node = output.grad_fn
            if node is not None and getattr(type(node), "_forward_cls", None) is case.op:
                return node
        return None
    queue = [output.grad_fn for output in outputs if isinstance(output, torch.Tensor) and output.grad_fn is not None]
    seen = set()
    while queue and len(seen) < NODES_SEARCHED:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if _is_custom_function_node(node):
            return node
        queue += [following for following, _ in getattr(node, "next_functions", ())]
    return None


def _is_custom_function_node(node):
    forward_cls = getattr(type(node), "_forward_cls", None)
    return isinstance(forward_cls, type) and issubclass(forward_cls, torch.autograd.Function)


def cuda_allocated(device):
    """Bytes the CUDA caching allocator holds for ``device`` after its queued work (None off CUDA)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def written_by_backward(case, prepared, differentiable):
    """(slot, name) of the op's inputs that backward changes in place (a memory-saving backward writing the
    gradients into its saved inputs), seen on one forward and backward on fresh copies of the leaves.

    Its cotangents come from a generator of its own: asking must not change the values the check draws next.
    """
    generator = torch.Generator().manual_seed(0)
    args, kwargs = prepared.call_args()
    arguments = tensor_arguments(case, args, kwargs)
    outputs = call_with(case, args, kwargs).outputs
    chosen = [outputs[i] for i in differentiable]
    written, _ = written_while(arguments, lambda: grads_of(chosen, prepared.leaves,
                                                           random_cotangents(chosen, generator, repeating=True)))
    return written


def written_while(arguments, action):
    """``((slot, name) of the tensor_arguments that action() changes in place, action()'s result)``: versions and
    values are compared, as a kernel writing through the raw memory moves no version counter."""
    before = [(tensor._version, tensor.detach().clone()) for _, _, tensor in arguments]
    result = action()
    written = [(slot, name) for (slot, name, tensor), (version, values) in zip(arguments, before)
               if tensor._version != version or not torch.equal(tensor.detach(), values)]
    return written, result

