"""Correct reference implementations of custom ``torch.autograd.Function`` s.

These are the classic examples from the PyTorch autograd tutorials
("Extending torch.autograd", "Double backward with custom functions" and the
C++ extension tutorial), plus a few small ops that exercise autograd features
the plugin's hygiene checks care about (in-place outputs, non-differentiable
outputs, ``once_differentiable``, multiple outputs with undefined gradients).

Every op here is *correct*.  Its planted-bug twin lives in
:mod:`reference_ops.buggy`.

Each op comes with a plain PyTorch reference function and a sample factory;
:data:`EXAMPLES` bundles the three together::

    fn, reference, samples = EXAMPLES["linear"]
    for args in samples(torch.Generator().manual_seed(0)):
        torch.testing.assert_close(fn.apply(*args), reference(*args))

Sample factories have the signature ``samples(generator=None,
dtype=torch.float32)`` and return a list of argument tuples.  Tensors in the
samples are plain data (``requires_grad=False``); the caller decides which of
them require grad and in which dtype they are checked.  Non-tensor arguments
(``None`` bias, Python numbers, ints) are passed through as they are.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Tuple

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

__all__ = [
    # functions
    "LinearFunction",
    "LinearFunctionSetupContext",
    "MulConstant",
    "KillHead",
    "AbsDot",
    "ElementwiseMul",
    "MyReLU",
    "RNNCell",
    "Cube",
    "AddOneInPlace",
    "SortWithIndices",
    "ScaleOnceDifferentiable",
    "SplitHalves",
    # references
    "linear_reference",
    "mul_constant_reference",
    "kill_head_reference",
    "abs_dot_reference",
    "elementwise_mul_reference",
    "relu_reference",
    "rnn_cell_reference",
    "cube_reference",
    "add_one_reference",
    "sort_reference",
    "scale_reference",
    "split_halves_reference",
    # sample factories
    "linear_samples",
    "mul_constant_samples",
    "kill_head_samples",
    "abs_dot_samples",
    "elementwise_mul_samples",
    "relu_samples",
    "rnn_cell_samples",
    "cube_samples",
    "add_one_samples",
    "sort_samples",
    "scale_samples",
    "split_halves_samples",
    # registry
    "Example",
    "EXAMPLES",
    "DOUBLE_DIFFERENTIABLE",
    "IN_PLACE",
]


def _flatten_leading(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` of shape ``(*, n)`` as a matrix of shape ``(prod(*), n)``."""
    return t.reshape(-1, t.shape[-1])


# ---------------------------------------------------------------------------
# 1. Linear
# ---------------------------------------------------------------------------


class LinearFunction(Function):
    """``input @ weight.T + bias`` -- the "Extending torch.autograd" example.

    Demonstrates ``ctx.save_for_backward`` (including saving ``None``), an
    optional argument, and ``ctx.needs_input_grad``: gradients nobody asked
    for are returned as ``None`` instead of being computed.  The backward is
    built from differentiable torch ops, so double backward works.

    ``input`` may have any number of leading dimensions: ``(*, in)``. Under
    ``torch.autocast`` forward's matmul returns a 16-bit output while the
    saved ``input`` and ``weight`` stay float32: backward brings
    ``grad_output`` to their dtype before multiplying them.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input @ weight.T
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_output = grad_output.to(input.dtype)  # 16-bit under autocast, like forward's matmul
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias


class LinearFunctionSetupContext(Function):
    """The same linear op, written in the ``forward`` + ``setup_context`` style.

    Demonstrates the newer API (torch >= 2.0): ``forward`` takes no ``ctx``
    and only computes; ``setup_context(ctx, inputs, output)`` saves what the
    backward needs.  This split is what lets the function work with
    ``torch.func`` transforms; ``generate_vmap_rule = True`` asks autograd to
    derive the vmap rule automatically.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(input, weight, bias=None):
        output = input @ weight.T
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        ctx.save_for_backward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_output = grad_output.to(input.dtype)  # 16-bit under autocast, like forward's matmul
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
        if bias is not None and len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        if len(ctx.needs_input_grad) == 2:
            return grad_input, grad_weight
        return grad_input, grad_weight, grad_bias


linear_reference = F.linear


# ---------------------------------------------------------------------------
# 2. MulConstant
# ---------------------------------------------------------------------------


class MulConstant(Function):
    """``tensor * constant`` with a Python-number constant.

    Demonstrates a non-tensor argument stored directly on ``ctx`` (whose
    gradient is ``None``) and ``ctx.set_materialize_grads(False)``: the
    backward may receive ``grad_output=None`` and must handle it.
    """

    @staticmethod
    def forward(ctx, tensor, constant):
        ctx.set_materialize_grads(False)
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:
            return None, None
        return grad_output * ctx.constant, None


def mul_constant_reference(tensor, constant):
    return tensor * constant


# ---------------------------------------------------------------------------
# 3. KillHead
# ---------------------------------------------------------------------------


def _head_mask(t: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.ones(t.shape[-1], dtype=t.dtype, device=t.device)
    mask[:n] = 0
    return mask


class KillHead(Function):
    """Zero the first ``n`` columns: ``x[..., :n] = 0`` on a copy of ``x``.

    Demonstrates an integer argument that selects part of the tensor, and a
    backward that applies the same mask to the gradient (the gradient of the
    killed columns is exactly zero).
    """

    @staticmethod
    def forward(ctx, x, n):
        ctx.n = n
        out = x.clone()
        out[..., :n] = 0
        return out

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * _head_mask(grad_output, ctx.n), None


def kill_head_reference(x, n):
    return x * _head_mask(x, n)


# ---------------------------------------------------------------------------
# 4. AbsDot
# ---------------------------------------------------------------------------


class AbsDot(Function):
    """``|u . v|`` over the last dimension (1-D vectors or batches of them).

    Demonstrates saving an intermediate (the sign of the dot product) next to
    the inputs.  ``grad_u = g * sign * v`` and ``grad_v = g * sign * u``.
    Not differentiable where the dot product is zero; samples avoid that.
    """

    @staticmethod
    def forward(ctx, u, v):
        dot = (u * v).sum(-1)
        sign = torch.sign(dot)
        ctx.save_for_backward(u, v, sign)
        return dot.abs()

    @staticmethod
    def backward(ctx, grad_output):
        u, v, sign = ctx.saved_tensors
        g = (grad_output * sign).unsqueeze(-1)
        grad_u = g * v if ctx.needs_input_grad[0] else None
        grad_v = g * u if ctx.needs_input_grad[1] else None
        return grad_u, grad_v


def abs_dot_reference(u, v):
    return (u * v).sum(-1).abs()


# ---------------------------------------------------------------------------
# 5. ElementwiseMul
# ---------------------------------------------------------------------------


class ElementwiseMul(Function):
    """``a * b`` for two tensors of the same shape (no broadcasting).

    Demonstrates the smallest two-input function: each input's gradient is
    the upstream gradient times the *other* saved input.
    """

    @staticmethod
    def forward(ctx, a, b):
        if a.shape != b.shape:
            raise ValueError(f"ElementwiseMul needs equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        grad_a = grad_output * b if ctx.needs_input_grad[0] else None
        grad_b = grad_output * a if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


elementwise_mul_reference = torch.mul


# ---------------------------------------------------------------------------
# 6. MyReLU
# ---------------------------------------------------------------------------


class MyReLU(Function):
    """``x.clamp(min=0)`` -- the ReLU from the "Learning PyTorch with Examples" tutorial.

    Demonstrates a backward that masks the gradient with a boolean test on the
    saved input: ``grad * (x > 0)``.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (x > 0).to(grad_output.dtype)


relu_reference = torch.relu


# ---------------------------------------------------------------------------
# 7. RNNCell
# ---------------------------------------------------------------------------


class RNNCell(Function):
    """Elman tanh cell ``tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)``.

    The fused-cell example of the C++ extension tutorial, in Python.
    Demonstrates saving the *output* for backward (``1 - out**2`` is the tanh
    derivative) and a backward written with differentiable torch ops, so the
    function supports double backward.  ``x`` is ``(batch, in)``, ``h`` is
    ``(batch, hidden)``.
    """

    @staticmethod
    def forward(ctx, x, h, w_ih, w_hh, b_ih, b_hh):
        out = torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        ctx.save_for_backward(x, h, w_ih, w_hh, out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, h, w_ih, w_hh, out = ctx.saved_tensors
        grad_pre = grad_output * (1 - out * out)
        needs = ctx.needs_input_grad
        grad_x = grad_pre @ w_ih if needs[0] else None
        grad_h = grad_pre @ w_hh if needs[1] else None
        grad_w_ih = grad_pre.T @ x if needs[2] else None
        grad_w_hh = grad_pre.T @ h if needs[3] else None
        grad_b_ih = grad_pre.sum(0) if needs[4] else None
        grad_b_hh = grad_pre.sum(0) if needs[5] else None
        return grad_x, grad_h, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh


def rnn_cell_reference(x, h, w_ih, w_hh, b_ih, b_hh):
    return torch.tanh(F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh))


# ---------------------------------------------------------------------------
# 8. Cube
# ---------------------------------------------------------------------------


class Cube(Function):
    """``x ** 3`` -- the "Double backward with custom functions" example.

    Demonstrates a backward that is itself differentiable: ``grad * 3 * x**2``
    is computed with torch ops on the *saved* (non-detached) input, so
    autograd can differentiate through it and ``gradgradcheck`` passes.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * 3 * x**2


def cube_reference(x):
    return x**3


# ---------------------------------------------------------------------------
# 9. AddOneInPlace
# ---------------------------------------------------------------------------


class AddOneInPlace(Function):
    """``x.add_(1)`` in place, returning ``x`` itself.

    Demonstrates ``ctx.mark_dirty``: autograd is told the input was modified
    in place, so it bumps the version bookkeeping, rebases the history of
    ``x`` onto this node, and refuses to run it on a leaf that requires grad.
    Call it on a non-leaf (e.g. ``x.clone()``).  Backward is the identity.
    """

    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def add_one_reference(x):
    return x + 1


# ---------------------------------------------------------------------------
# 10. SortWithIndices
# ---------------------------------------------------------------------------


class SortWithIndices(Function):
    """Sort along the last dimension, returning ``(values, indices)``.

    Demonstrates a multi-output function with an integer output marked by
    ``ctx.mark_non_differentiable(indices)``; backward receives a gradient
    for both outputs (the one for ``indices`` is ignored) and scatters the
    values' gradient back to the original positions.
    """

    @staticmethod
    def forward(ctx, x):
        values, indices = torch.sort(x, dim=-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        return torch.zeros_like(grad_values).scatter(-1, indices, grad_values)


def sort_reference(x):
    values, indices = torch.sort(x, dim=-1)
    return values, indices


# ---------------------------------------------------------------------------
# 11. ScaleOnceDifferentiable
# ---------------------------------------------------------------------------


class ScaleOnceDifferentiable(Function):
    """``x * 2`` with a backward decorated ``@once_differentiable``.

    Demonstrates ``once_differentiable``: the backward runs under no-grad on
    detached tensors, so first-order gradients are right while any attempt to
    differentiate the backward raises instead of silently giving zero.
    """

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        return grad_output * 2


def scale_reference(x):
    return x * 2


# ---------------------------------------------------------------------------
# 12. SplitHalves
# ---------------------------------------------------------------------------


class SplitHalves(Function):
    """Two outputs ``(x[..., :k] * 2, x[..., k:] * 3)``.

    Demonstrates a multi-output function with ``ctx.set_materialize_grads(False)``:
    when only one output is used, the other output's gradient arrives as
    ``None``, and backward fills that part with zeros itself (returning
    ``None`` when neither output has a gradient).
    """

    @staticmethod
    def forward(ctx, x, k):
        ctx.set_materialize_grads(False)
        ctx.k = k
        ctx.x_shape = x.shape
        return x[..., :k] * 2, x[..., k:] * 3

    @staticmethod
    def backward(ctx, grad_head, grad_tail):
        if grad_head is None and grad_tail is None:
            return None, None
        k = ctx.k
        shape = ctx.x_shape
        ref = grad_head if grad_head is not None else grad_tail
        if grad_head is None:
            grad_head_in = ref.new_zeros(shape[:-1] + (k,))
        else:
            grad_head_in = grad_head * 2
        if grad_tail is None:
            grad_tail_in = ref.new_zeros(shape[:-1] + (shape[-1] - k,))
        else:
            grad_tail_in = grad_tail * 3
        return torch.cat([grad_head_in, grad_tail_in], dim=-1), None


def split_halves_reference(x, k):
    return x[..., :k] * 2, x[..., k:] * 3


# ---------------------------------------------------------------------------
# Sample factories
# ---------------------------------------------------------------------------

Sample = Tuple[object, ...]
SampleFactory = Callable[..., List[Sample]]


def _randn(*shape, generator=None, dtype=torch.float32):
    return torch.randn(*shape, generator=generator, dtype=dtype)


def linear_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """Samples for ``LinearFunction``: with bias, without bias (``None``), batched input."""
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [
        (r(3, 4), r(5, 4), r(5)),
        (r(3, 4), r(5, 4), None),
        (r(2, 3, 4), r(5, 4), r(5)),
    ]


def mul_constant_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4), 2.5), (r(5), -0.5)]


def kill_head_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 5), 2), (r(2, 3, 4), 1)]


def _abs_dot_pair(shape, sign, generator, dtype):
    # v = sign * 1.5 * u / |u|^2 + w with w orthogonal to u, so u . v = sign * 1.5
    # exactly: far from the kink of |.| at zero.
    u = _randn(*shape, generator=generator, dtype=dtype)
    n = _randn(*shape, generator=generator, dtype=dtype)
    uu = (u * u).sum(-1, keepdim=True)
    w = n - (n * u).sum(-1, keepdim=True) / uu * u
    v = sign * 1.5 * u / uu + 0.5 * w
    return u, v


def abs_dot_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """1-D and batched pairs whose dot products are +-1.5 (away from the kink at 0)."""
    return [
        _abs_dot_pair((5,), 1.0, generator, dtype),
        _abs_dot_pair((5,), -1.0, generator, dtype),
        _abs_dot_pair((3, 4), -1.0, generator, dtype),
    ]


def elementwise_mul_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4), r(3, 4)), (r(6), r(6))]


def _away_from_zero(x, margin=0.1):
    return torch.where(x >= 0, x + margin, x - margin)


def relu_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """Values at least 0.1 away from the kink at 0, both signs present."""
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(_away_from_zero(r(3, 4)),), (_away_from_zero(r(7)),)]


def rnn_cell_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """``(x, h, w_ih, w_hh, b_ih, b_hh)`` with batch 3, input 4, hidden 5."""
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    batch, n_in, n_hidden = 3, 4, 5
    return [
        (
            r(batch, n_in),
            r(batch, n_hidden),
            0.5 * r(n_hidden, n_in),
            0.5 * r(n_hidden, n_hidden),
            0.1 * r(n_hidden),
            0.1 * r(n_hidden),
        )
    ]


def cube_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4),), (r(5),)]


def add_one_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """Plain tensors; the caller must pass a non-leaf (e.g. ``x.clone()``) to the in-place op."""
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4),), (r(5),)]


def _distinct_rows(rows, n, generator, dtype):
    # A random permutation of 0, 0.5, 1, ... plus jitter < 0.1: all values are
    # at least 0.4 apart, so the sort order is stable under finite differences.
    out = []
    for _ in range(rows):
        perm = torch.randperm(n, generator=generator).to(dtype) * 0.5
        out.append(perm + 0.1 * torch.rand(n, generator=generator, dtype=dtype))
    return torch.stack(out)


def sort_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    """Rows of well-separated values (no ties), 1-D and 2-D."""
    return [
        (_distinct_rows(3, 5, generator, dtype),),
        (_distinct_rows(1, 6, generator, dtype)[0],),
    ]


def scale_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4),), (r(5),)]


def split_halves_samples(generator=None, dtype=torch.float32) -> List[Sample]:
    r = lambda *s: _randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 5), 2), (r(4), 1)]


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


class Example(NamedTuple):
    """``(function, reference, samples)`` -- unpacks like a plain 3-tuple."""

    function: type
    reference: Callable[..., object]
    samples: SampleFactory


EXAMPLES = {
    "linear": Example(LinearFunction, linear_reference, linear_samples),
    "linear_setup_context": Example(LinearFunctionSetupContext, linear_reference, linear_samples),
    "mul_constant": Example(MulConstant, mul_constant_reference, mul_constant_samples),
    "kill_head": Example(KillHead, kill_head_reference, kill_head_samples),
    "abs_dot": Example(AbsDot, abs_dot_reference, abs_dot_samples),
    "elementwise_mul": Example(ElementwiseMul, elementwise_mul_reference, elementwise_mul_samples),
    "relu": Example(MyReLU, relu_reference, relu_samples),
    "rnn_cell": Example(RNNCell, rnn_cell_reference, rnn_cell_samples),
    "cube": Example(Cube, cube_reference, cube_samples),
    "add_one_in_place": Example(AddOneInPlace, add_one_reference, add_one_samples),
    "sort_with_indices": Example(SortWithIndices, sort_reference, sort_samples),
    "scale_once_differentiable": Example(ScaleOnceDifferentiable, scale_reference, scale_samples),
    "split_halves": Example(SplitHalves, split_halves_reference, split_halves_samples),
}
"""Short name -> ``Example(function, reference, samples)``."""

DOUBLE_DIFFERENTIABLE = frozenset(name for name in EXAMPLES if name != "scale_once_differentiable")
"""Names in :data:`EXAMPLES` whose backward supports double backward."""

IN_PLACE = frozenset({"add_one_in_place"})
"""Names in :data:`EXAMPLES` that modify an input in place (call them on a non-leaf)."""
