"""Ops that only work with ``.backward()``, driven that way.

``torch.utils.checkpoint(..., use_reentrant=True)`` refuses
``torch.autograd.grad`` (and ``.backward(inputs=...)``): its backward
re-runs the forward and calls ``.backward()`` itself. The checks take
gradients with ``torch.autograd.grad``; for such an op they call
``torch.autograd.backward`` on the leaves instead and read ``.grad``, which
gives the same vector-Jacobian product. Where no ``.backward()`` equivalent
exists (a second derivative), the check skips, saying why.
"""

import torch

REFUSALS = ("incompatible with .grad()", "not compatible with .grad()")

SECOND_DERIVATIVE_REASON = (
    "the op only works with .backward() (torch.utils.checkpoint with use_reentrant=True refuses "
    "torch.autograd.grad), so its second derivative cannot be taken; use use_reentrant=False to have it checked")


def only_backward_works(error):
    """True when ``error`` is autograd refusing ``torch.autograd.grad`` for an op that needs ``.backward()``."""
    return any(refusal in str(error) for refusal in REFUSALS)


def grads_by_backward(outputs, leaves, cotangents, create_graph=False, retain_graph=None):
    """``torch.autograd.grad`` through ``.backward()``: each leaf's ``.grad`` is saved, read and restored."""
    saved = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
        if not leaf.is_leaf:
            leaf.retain_grad()
    try:
        torch.autograd.backward(outputs, cotangents, retain_graph=retain_graph, create_graph=create_graph)
        return [leaf.grad for leaf in leaves]
    finally:
        for leaf, grad in zip(leaves, saved):
            leaf.grad = grad


def _holds_reentrant_checkpoint(outputs, limit=10_000):
    """True when the graph behind ``outputs`` holds a reentrant checkpoint node.

    Found before differentiating: a refused ``torch.autograd.grad`` has
    already run (and freed) the nodes after the checkpoint, so falling back
    only after the refusal would fail on an op that mutates an output in place.
    """
    stack = [getattr(output, "grad_fn", None) for output in outputs]
    seen = set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "CheckpointFunction" in node.name():
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


def autograd_grad(outputs, inputs, grad_outputs, allow_unused=True, create_graph=False, retain_graph=None):
    """``torch.autograd.grad``, falling back to ``.backward()`` for an op that refuses it."""
    if _holds_reentrant_checkpoint(outputs):
        return tuple(grads_by_backward(list(outputs), list(inputs), list(grad_outputs), create_graph, retain_graph))
    try:
        return torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=allow_unused,
                                   create_graph=create_graph, retain_graph=retain_graph)
    except RuntimeError as error:
        if not only_backward_works(error):
            raise
        return tuple(grads_by_backward(list(outputs), list(inputs), list(grad_outputs), create_graph, retain_graph))
