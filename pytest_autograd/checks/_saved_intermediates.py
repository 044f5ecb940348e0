"""Is a wrong second derivative explained by a tensor forward computed and saved for backward?

The most common double-backward bug: forward computes ``s = 1 - tanh(x)**2``
and saves it (``ctx.save_for_backward(x, s)`` or ``ctx.s = s``); backward
returns ``grad * s``. Forward runs without a graph, so ``s`` has none, and
double backward treats it as a constant: the second derivative misses the
term through ``s``. Saved inputs and outputs keep their graph; only such
intermediates lose it.

The evidence is an experiment, not a guess: the backward is differentiated
numerically once more with every graph-less tensor saved in forward held at
its value at the sample (``saved_tensors_hooks`` for ``save_for_backward``,
the ctx attributes for ``ctx.s = s``). When that frozen derivative matches
the analytical second derivative while the true one does not, the lost
dependence explains the whole error.
"""

import contextlib

import torch
from torch.autograd.function import BackwardCFunction


def graphless(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not tensor.requires_grad


class Freezer:
    """Wraps the op's forward (``around_forward``): records graph-less saved tensors, or replays them."""

    def __init__(self):
        self.packed = None  # the graph-less tensors save_for_backward packed at the sample, in order
        self.attributes = None  # [(node number, name, value)] of graph-less ctx attributes at the sample

    def around_forward(self, run):
        recording = self.packed is None
        packed = [] if recording else list(self.packed)

        def pack(tensor):
            if not graphless(tensor):
                return tensor
            if recording:
                packed.append(tensor.detach().clone())
                return tensor
            frozen = packed.pop(0) if packed else None
            return frozen if frozen is not None and frozen.shape == tensor.shape else tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            outputs = run()
        nodes = _custom_nodes(outputs)
        if recording:
            self.packed = packed
            self.attributes = [(n, name, value.detach().clone()) for n, node in enumerate(nodes)
                               for name, value in vars(node).items() if graphless(value)]
            return outputs
        for n, name, value in self.attributes:
            if n < len(nodes) and graphless(getattr(nodes[n], name, None)):
                setattr(nodes[n], name, value)
        return outputs

    @property
    def found(self):
        return bool(self.packed) or bool(self.attributes)


def _custom_nodes(outputs):
    """The custom Functions' nodes behind ``outputs``, in a fixed order."""
    found, seen = [], set()
    stack = [output.grad_fn for output in reversed(outputs) if isinstance(output, torch.Tensor)
             and output.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, BackwardCFunction):
            found.append(node)
        stack.extend(next_node for next_node, _ in reversed(node.next_functions))
    return found


def frozen_explains(error, base_leaves, backward_with, eps, atol, rtol):
    """Whether ``error`` (a second-derivative DerivativeError) is what holding graph-less saved tensors fixed gives.

    ``backward_with(around_forward)``: the backward function (leaves -> first gradients) whose forward runs
    inside ``around_forward``. Returns the Freezer when the frozen numerical derivative matches the analytical
    one, else None.
    """
    locus = error.locus or {}
    if locus.get("leaf") is None or locus.get("element") is None or locus.get("negated"):
        return None
    freezer = Freezer()
    backward = backward_with(freezer.around_forward)
    base = [leaf.detach() for leaf in base_leaves]
    with contextlib.suppress(Exception):
        backward([b.clone().requires_grad_(True) for b in base])  # records the sample's saved tensors
    if freezer.packed is None or not freezer.found:
        return None
    direction = [torch.zeros_like(b) for b in base]
    direction[locus["leaf"]][tuple(locus["element"])] = 1.0

    def at(sign):
        moved = [(b + sign * eps * d).detach().requires_grad_(True) for b, d in zip(base, direction)]
        return [out.detach() for out in backward(moved)]

    try:
        plus, minus = at(1.0), at(-1.0)
    except Exception:  # noqa: BLE001 - the experiment failing proves nothing
        return None
    if locus.get("output") is not None:
        k, row = locus["output"], tuple(locus["row"])
        frozen = float((plus[k][row] - minus[k][row]) / (2 * eps))
    else:
        cotangents = locus.get("cotangents") or []
        frozen = sum(float((c.to(torch.float64) * (p - m).to(torch.float64)).sum())
                     for c, p, m in zip(cotangents, plus, minus) if c is not None) / (2 * eps)
    if abs(frozen - error.got) <= atol + rtol * abs(frozen) and abs(frozen - error.expected) > error.tolerance:
        return freezer
    return None


def saved_intermediate_hint(saved, argument):
    where = ", ".join(saved[:3]) + (" and more" if len(saved) > 3 else "") if saved else "a tensor"
    return (f"forward computed and saved {where}, which has no graph (forward runs without one), so double "
            f"backward treats it as a constant and loses its dependence on `{argument}`: holding every such saved "
            "tensor fixed gives exactly the analytical second derivative. Recompute it inside backward from the "
            "saved inputs with differentiable ops, or save an output instead (outputs keep their graph)")
