"""Planted-bug twins of the ops in :mod:`reference_ops.functions`.

Each class below looks like a plausible implementation and has the same
signature as its correct twin, but contains exactly one classic mistake,
named in its docstring.  They exist so tests and the tutorial can show that a
check actually fails on the bug it is meant to catch.

:data:`PLANTED_BUGS` maps each buggy class name to a :class:`PlantedBug`
``(function, twin, example)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd import Function

from .functions import (
    AddOneInPlace,
    Cube,
    LinearFunction,
    MulConstant,
    MyReLU,
    RNNCell,
    ScaleOnceDifferentiable,
    _flatten_leading,
)

__all__ = [
    "LinearWeightGradTransposed",
    "LinearGradInputWrong",
    "RNNCellMissingTanhDerivative",
    "ReLUPositiveGradOnly",
    "CubeNotDifferentiableBackward",
    "CubeWrongAtOneElement",
    "MulConstantNoNoneHandling",
    "AddOneInPlaceNoMarkDirty",
    "ScaleMutatesGradOutput",
    "LinearSavesCtxAttributes",
    "ReLUSavesOutputOnCtx",
    "LinearFloat32Backward",
    "LinearNeedsInputGradMisuse",
    "ReLUNondeterministic",
    "LinearContiguousAssumption",
    "LinearWeightGradLastColumnTwice",
    "LinearGradInputFirstRowTwice",
    "PlantedBug",
    "PLANTED_BUGS",
]


def _linear_forward(input, weight, bias):
    output = input @ weight.T
    if bias is not None:
        output = output + bias
    return output


# ---------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------


class LinearWeightGradTransposed(Function):
    """Bug: weight gradient computed as ``input.T @ grad_output`` (the transpose).

    The correct value is ``grad_output.T @ input`` of shape ``(out, in)``; the
    buggy one has shape ``(in, out)`` and is reshaped to the weight's shape,
    so autograd's shape check passes.  For square weights it is exactly the
    transpose of the right answer; for any shape it is silently wrong.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = (_flatten_leading(input).T @ _flatten_leading(grad_output)).reshape(weight.shape)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearGradInputWrong(Function):
    """Bug: input gradient forgets a term of the contraction.

    ``grad_input`` should be ``grad_output @ weight`` summed over *all* output
    features; an off-by-one slice drops the last output feature's
    contribution.  Shapes are right, values are wrong.  Weight and bias
    gradients are correct.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output[..., :-1] @ weight[:-1]
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearSavesCtxAttributes(Function):
    """Bug: tensors stashed as ``ctx.input = input`` instead of ``save_for_backward``.

    Plain ctx attributes bypass autograd's saved-tensor machinery:

    * no version check -- modifying an input in place after the forward
      silently changes the gradients instead of raising;
    * no release -- the tensors stay alive as long as the graph does, even
      after ``backward()`` without ``retain_graph`` freed every properly
      saved tensor, which holds on to memory in training loops;
    * saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, used
      by activation offloading/checkpointing) never see them.

    Gradients themselves are correct when nothing is mutated.  (Stashing the
    *output* this way additionally creates a reference cycle; see
    :class:`ReLUSavesOutputOnCtx`.)
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.input = input
        ctx.weight = weight
        ctx.bias = bias
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.input, ctx.weight, ctx.bias
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearFloat32Backward(Function):
    """Bug: backward silently computes in float32 and casts back.

    Forward is exact in the input dtype, but the backward does
    ``grad_output.float() @ weight.float()`` and returns ``.to(input.dtype)``,
    so float64 gradients carry float32 rounding error (~1e-7 relative).  The
    returned dtype is right, so only a tight float64 comparison notices.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        g = grad_output.float()
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = (g @ weight.float()).to(input.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (_flatten_leading(g).T @ _flatten_leading(input.float())).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(g).sum(0).to(bias.dtype)
        return grad_input, grad_weight, grad_bias


class LinearNeedsInputGradMisuse(Function):
    """Bug: ``ctx.needs_input_grad`` indices off by one for weight and bias.

    The weight gradient is gated on ``needs_input_grad[2]`` (the bias) and the
    bias gradient on ``needs_input_grad[1]`` (the weight).  When everything
    requires grad the result is right.  Otherwise it is wrong: with no bias
    (or a bias that does not require grad) the weight gets no gradient at
    all, and with ``bias=None`` and a weight that requires grad, backward
    returns a gradient for the ``None`` argument, which autograd rejects.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[2]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if ctx.needs_input_grad[1]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearContiguousAssumption(Function):
    """Bug: backward reads the saved input's raw storage assuming it is contiguous.

    The weight gradient flattens the input with ``as_strided(..., (in, 1))``
    -- what a hand-written kernel does when it walks ``data_ptr()`` -- instead
    of ``reshape``.  Contiguous inputs give the right answer; a transposed or
    sliced input gives a same-shaped, wrong weight gradient without raising.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            n_in = input.shape[-1]
            flat_input = input.as_strided((input.numel() // n_in, n_in), (n_in, 1))
            grad_weight = _flatten_leading(grad_output).T @ flat_input
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearWeightGradLastColumnTwice(Function):
    """Bug: the weight gradient's last column (the last input feature) is accumulated twice.

    A kernel that sums ``grad_output.T @ input`` over blocks of input
    features and handles the remainder apart adds the last feature's partial
    sum in the loop and once more after it. Every other column, and the input
    and bias gradients, are right; the wrong column's index moves with the
    input's width.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
            grad_weight = torch.cat([grad_weight[:, :-1], 2 * grad_weight[:, -1:]], dim=1)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearGradInputFirstRowTwice(Function):
    """Bug: the input gradient's first row (the batch's first sample) is written twice as large.

    A kernel whose prologue handles the first row and whose main loop starts
    at row 0 instead of 1 adds that row's gradient twice. Every other row,
    and the weight and bias gradients, are right.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            rows = _flatten_leading(grad_output) @ weight
            grad_input = torch.cat([2 * rows[:1], rows[1:]]).reshape(input.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------------------
# RNN cell
# ---------------------------------------------------------------------------


class RNNCellMissingTanhDerivative(Function):
    """Bug: backward forgets the tanh derivative ``(1 - out**2)``.

    The upstream gradient is used directly as the pre-activation gradient,
    as if the cell had no nonlinearity.  All six gradients are wrong (by the
    factor ``1 - out**2``), with the right shapes.
    """

    @staticmethod
    def forward(ctx, x, h, w_ih, w_hh, b_ih, b_hh):
        out = torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        ctx.save_for_backward(x, h, w_ih, w_hh, out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, h, w_ih, w_hh, out = ctx.saved_tensors
        grad_pre = grad_output
        needs = ctx.needs_input_grad
        grad_x = grad_pre @ w_ih if needs[0] else None
        grad_h = grad_pre @ w_hh if needs[1] else None
        grad_w_ih = grad_pre.T @ x if needs[2] else None
        grad_w_hh = grad_pre.T @ h if needs[3] else None
        grad_b_ih = grad_pre.sum(0) if needs[4] else None
        grad_b_hh = grad_pre.sum(0) if needs[5] else None
        return grad_x, grad_h, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh


# ---------------------------------------------------------------------------
# ReLU
# ---------------------------------------------------------------------------


class ReLUPositiveGradOnly(Function):
    """Bug: backward clamps the upstream gradient, ``grad_output.clamp(min=0)``.

    Right whenever every cotangent is non-negative -- including the one-hot
    cotangents ``gradcheck`` uses to build the Jacobian row by row, and
    ``y.sum().backward()`` -- but negative cotangent entries are zeroed.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output.clamp(min=0) * (x > 0).to(grad_output.dtype)


SCHEDULING = torch.Generator().manual_seed(0)  # stands in for the order a kernel's threads happen to finish in


class ReLUNondeterministic(Function):
    """Bug: backward scales the gradient by ``1 + 1e-5 * u``, ``u`` drawn from a generator of its own.

    Stands in for a kernel with a race or unordered atomic accumulation: two
    backward passes with the same inputs and cotangent give slightly
    different gradients, and no reseeding of torch's generators makes them
    agree (scheduling is not seeded).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        race = torch.rand(grad_output.shape, generator=SCHEDULING, dtype=grad_output.dtype)
        noisy = grad_output * (1 + 1e-5 * race.to(grad_output.device))
        return noisy * (x > 0).to(grad_output.dtype)


class ReLUSavesOutputOnCtx(Function):
    """Bug: the *output* is stashed as ``ctx.output = output`` for the backward mask.

    ``output -> grad_fn (this ctx) -> ctx.output -> output`` is a reference
    cycle through the autograd graph.  Reference counting can never free it:
    the output, the graph and everything they saved stay alive after the
    last user reference is gone, until Python's cyclic garbage collector
    happens to run (device memory is not what triggers it).  Use
    ``ctx.save_for_backward(output)`` instead.  Gradients are correct.
    """

    @staticmethod
    def forward(ctx, x):
        output = x.clamp(min=0)
        ctx.output = output
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * (ctx.output > 0).to(grad_output.dtype)


# ---------------------------------------------------------------------------
# Cube
# ---------------------------------------------------------------------------


class CubeNotDifferentiableBackward(Function):
    """Bug: backward computes ``grad * 3 * x.detach()**2``.

    The first derivative is right, but the detach cuts the backward's
    dependence on ``x``: double backward silently misses the ``6 * x`` term
    (and does not raise, unlike ``@once_differentiable``).
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * 3 * x.detach() ** 2


class CubeWrongAtOneElement(Function):
    """Bug: gradient right except at one element -- the last element of the flattened grad is doubled.

    A single-entry error is the kind random-projection (fast) gradient checks
    can miss when the projection weight on that entry is small; a full
    Jacobian check catches it.  The backward stays differentiable.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        scale = torch.ones(x.numel(), dtype=grad_output.dtype, device=grad_output.device)
        scale[-1] = 2
        return grad_output * 3 * x**2 * scale.reshape(x.shape)


# ---------------------------------------------------------------------------
# MulConstant
# ---------------------------------------------------------------------------


class MulConstantNoNoneHandling(Function):
    """Bug: ``ctx.set_materialize_grads(False)`` but backward never checks for ``None``.

    ``grad_output * ctx.constant`` raises ``TypeError`` whenever autograd
    passes an undefined gradient (e.g. a downstream op returned ``None``, or
    ``gradcheck``'s undefined-grad check).
    """

    @staticmethod
    def forward(ctx, tensor, constant):
        ctx.set_materialize_grads(False)
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.constant, None


# ---------------------------------------------------------------------------
# In-place / aliasing hygiene
# ---------------------------------------------------------------------------


class AddOneInPlaceNoMarkDirty(Function):
    """Bug: modifies its input in place (``x.add_(1)``) without ``ctx.mark_dirty(x)``.

    Autograd is not told about the mutation: it silently mutates a leaf that
    requires grad (the correct op raises), the returned tensor is a fresh
    view of ``x`` rather than ``x`` itself while ``x`` keeps its old
    history, and any other node that saved ``x`` earlier fails a version
    check at backward time, far away from the actual culprit.
    """

    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class ScaleMutatesGradOutput(Function):
    """Bug: backward scales the incoming gradient in place, ``grad_output.mul_(2)``.

    The gradient is right, but ``grad_output`` belongs to the caller (for
    example the ``grad_outputs`` passed to ``torch.autograd.grad``, or a
    buffer shared with a sibling branch of the graph), which is silently
    overwritten.
    """

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.mul_(2)


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


class PlantedBug(NamedTuple):
    """``(function, twin, example)``: the buggy op, its correct twin, and the
    :data:`reference_ops.functions.EXAMPLES` key whose reference and samples fit it."""

    function: type
    twin: type
    example: str


PLANTED_BUGS = {
    "LinearWeightGradTransposed": PlantedBug(LinearWeightGradTransposed, LinearFunction, "linear"),
    "LinearGradInputWrong": PlantedBug(LinearGradInputWrong, LinearFunction, "linear"),
    "LinearSavesCtxAttributes": PlantedBug(LinearSavesCtxAttributes, LinearFunction, "linear"),
    "LinearFloat32Backward": PlantedBug(LinearFloat32Backward, LinearFunction, "linear"),
    "LinearNeedsInputGradMisuse": PlantedBug(LinearNeedsInputGradMisuse, LinearFunction, "linear"),
    "LinearContiguousAssumption": PlantedBug(LinearContiguousAssumption, LinearFunction, "linear"),
    "LinearWeightGradLastColumnTwice": PlantedBug(LinearWeightGradLastColumnTwice, LinearFunction, "linear"),
    "LinearGradInputFirstRowTwice": PlantedBug(LinearGradInputFirstRowTwice, LinearFunction, "linear"),
    "RNNCellMissingTanhDerivative": PlantedBug(RNNCellMissingTanhDerivative, RNNCell, "rnn_cell"),
    "ReLUPositiveGradOnly": PlantedBug(ReLUPositiveGradOnly, MyReLU, "relu"),
    "ReLUNondeterministic": PlantedBug(ReLUNondeterministic, MyReLU, "relu"),
    "ReLUSavesOutputOnCtx": PlantedBug(ReLUSavesOutputOnCtx, MyReLU, "relu"),
    "CubeNotDifferentiableBackward": PlantedBug(CubeNotDifferentiableBackward, Cube, "cube"),
    "CubeWrongAtOneElement": PlantedBug(CubeWrongAtOneElement, Cube, "cube"),
    "MulConstantNoNoneHandling": PlantedBug(MulConstantNoNoneHandling, MulConstant, "mul_constant"),
    "AddOneInPlaceNoMarkDirty": PlantedBug(AddOneInPlaceNoMarkDirty, AddOneInPlace, "add_one_in_place"),
    "ScaleMutatesGradOutput": PlantedBug(ScaleMutatesGradOutput, ScaleOnceDifferentiable, "scale_once_differentiable"),
}
"""Buggy class name -> ``PlantedBug(function, twin, example)``."""
