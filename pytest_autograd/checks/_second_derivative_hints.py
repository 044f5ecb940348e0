"""Hints for second-derivative failures whose cause has a known shape.

* A backward that refuses to be differentiated ("double backwards on
  roi_align not supported", "derivative for aten::_ctc_loss_backward is not
  implemented"): the op has no second derivative, and the marker can say so.
* A NaN or infinite second derivative where the numerical one is finite:
  backward applies ``sqrt``/``pow``/``log`` to a saved value that is 0
  (d sqrt(y)/dy is inf there, and inf * 0 is NaN), or ``torch.where`` keeps
  the safe branch while the discarded branch's gradient is NaN.
"""

import re

_REFUSALS = re.compile(
    r"double[ -]backwards?\b.*not (supported|implemented)"
    r"|not (supported|implemented) for double[ -]backward"
    r"|derivative for \S+ is not implemented"
    r"|does not support (double|second)[ -](backward|derivative)"
    r"|second[ -]order (gradients|derivatives?) (are|is) not (supported|implemented)",
    re.IGNORECASE,
)

DOUBLE_BACKWARD_HINT = ("the op's backward cannot itself be differentiated (its kernel has no double backward): "
                        "declare it with double_backward=False on the marker, or give the backward a backward")

NON_FINITE_HINT = ("the second derivative is NaN/inf where the numerical one is finite: backward likely applies "
                   "sqrt, pow or log to a saved value that is 0 there (d sqrt(y)/dy is inf at 0, and inf * 0 is NaN), "
                   "or uses the torch.where gradient trap (torch.where keeps the safe branch, but the gradient of the "
                   "discarded one is NaN and NaN * 0 is NaN). Make the unsafe input safe before the op, e.g. "
                   "torch.where(y > 0, y, 1).sqrt(), or compute the gradient without that op (2 * x instead of "
                   "2 * sqrt(x * x))")


def refuses_double_backward(error):
    """True when ``error`` says the backward has no derivative of its own."""
    return bool(_REFUSALS.search(str(error)))


def graphless_saved_tensors(outputs, constants=()):
    """Where custom Functions on the path to ``outputs`` saved a tensor that is neither an input nor an output.

    Forward runs without a graph, so such a tensor (``ctx.save_for_backward(s)``
    or ``ctx.s = s`` for an ``s`` computed there) is a constant to double
    backward: its dependence on the inputs is lost. Saved inputs and outputs
    keep theirs. ``constants``: the op's non-differentiated floating
    arguments, which are constants anyway. Returns descriptions such as
    ``ctx.saved_tensors[1] of Tanh (shape (3,))``.
    """
    import torch
    from torch.autograd.function import BackwardCFunction

    found, seen = [], set()
    stack = [output.grad_fn for output in outputs if output.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
        if not isinstance(node, BackwardCFunction):
            continue
        owner = getattr(getattr(node, "_forward_cls", None), "__name__", type(node).__name__)
        try:
            saved = list(node.saved_tensors)
        except RuntimeError:  # freed already: nothing to say
            saved = []
        named = [(f"ctx.saved_tensors[{i}]", t) for i, t in enumerate(saved)]
        named += [(f"ctx.{name}", value) for name, value in vars(node).items() if isinstance(value, torch.Tensor)]
        for where, tensor in named:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not tensor.requires_grad \
                    and not any(_same(tensor, constant) for constant in constants):
                found.append(f"{where} of {owner} (shape {tuple(tensor.shape)})")
    return found


def _same(tensor, other):
    import torch

    return tensor.shape == other.shape and tensor.dtype == other.dtype and bool(torch.equal(tensor.cpu(), other.cpu()))

