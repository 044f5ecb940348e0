"""Ops for the transform and precision checks, each correct one beside its planted-bug twin.

* forward-mode AD: :class:`MulWithJvp` / :class:`MulJvpReusesTangent`;
* ``torch.func.vmap``: :class:`RowDot` (a ``vmap`` staticmethod) /
  :class:`RowDotVmapAssumesDimZero`;
* ``torch.compile``: :class:`CubeValidatesInput` (data-dependent branch, a
  graph break) beside :class:`reference_ops.Cube`; :func:`scaled_row_sum` /
  :func:`scaled_row_sum_default_dtype_fake` (a custom op whose fake impl
  allocates in the default dtype, which inductor silently trusts);
* ``torch.library.opcheck``: :data:`scaled_sin` / :data:`scaled_sin_no_fake` /
  :data:`scaled_sin_mutates_input`; :data:`row_sum` / :data:`row_sum_default_dtype_fake`
  (a fake impl in the default dtype, seen only in samples of another dtype);
* precision: :class:`LinearHalfMatmul` (a float32 path that runs its matmul
  in bfloat16) and :class:`NaiveVariance` with :func:`naive_variance_reference`
  (imprecise, but no worse than its reference);
* extreme values: :class:`NaiveSoftmax` / :class:`StableSoftmax`.

Custom ops live in the ``pytest_autograd_ref`` namespace and are defined once
per process, so importing this module twice (e.g. from pytester runs) is safe.
"""

import torch
from torch import Tensor
from torch.autograd import Function

__all__ = [
    "CubeValidatesInput",
    "LinearHalfMatmul",
    "MulJvpReusesTangent",
    "MulWithJvp",
    "NaiveSoftmax",
    "NaiveVariance",
    "RowDot",
    "RowDotVmapAssumesDimZero",
    "StableSoftmax",
    "naive_variance_reference",
    "row_sum",
    "row_sum_default_dtype_fake",
    "scaled_row_sum",
    "scaled_row_sum_default_dtype_fake",
    "scaled_sin",
    "scaled_sin_mutates_input",
    "scaled_sin_no_fake",
    "softmax_reference",
]

NAMESPACE = "pytest_autograd_ref"


# ---------------------------------------------------------------------------
# Forward-mode AD
# ---------------------------------------------------------------------------


class MulWithJvp(Function):
    """``a * b`` with backward and jvp: ``d(a b) = da b + a db``."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        return grad_output * b, grad_output * a

    @staticmethod
    def jvp(ctx, a_t, b_t):
        a, b = ctx.saved_tensors
        return a_t * b + a * b_t


class MulJvpReusesTangent(MulWithJvp):
    """Bug: jvp uses ``a``'s tangent for both terms, ``a_t * b + a * a_t``; backward is right."""

    @staticmethod
    def jvp(ctx, a_t, b_t):
        a, b = ctx.saved_tensors
        return a_t * b + a * a_t


# ---------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------


class RowDot(Function):
    """``(x * weight).sum(-1)`` for ``x`` of shape ``(..., n)`` and ``weight`` ``(n,)``.

    setup_context style with its own ``vmap`` staticmethod: each input's batch
    dim is moved to the front (or a size-1 dim added where it is unbatched)
    before the maths runs on the batched tensors.
    """

    @staticmethod
    def forward(x, weight):
        return (x * weight).sum(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad = grad_output.unsqueeze(-1)
        return grad * weight, (grad * x).reshape(-1, x.shape[-1]).sum(0)

    @staticmethod
    def vmap(info, in_dims, x, weight):
        x_dim, w_dim = in_dims
        x = x.movedim(x_dim, 0) if x_dim is not None else x.unsqueeze(0)
        weight = weight.movedim(w_dim, 0) if w_dim is not None else weight.unsqueeze(0)
        weight = weight.reshape(weight.shape[0], *([1] * (x.dim() - 2)), weight.shape[-1])
        return (x * weight).sum(-1), 0


class RowDotVmapAssumesDimZero(RowDot):
    """Bug: the vmap rule takes dim 0 as the batch dim instead of moving ``in_dims`` there."""

    @staticmethod
    def vmap(info, in_dims, x, weight):
        x_dim, w_dim = in_dims
        x = x if x_dim is not None else x.unsqueeze(0)
        weight = weight if w_dim is not None else weight.unsqueeze(0)
        weight = weight.reshape(weight.shape[0], *([1] * (x.dim() - 2)), weight.shape[-1])
        return (x * weight).sum(-1), 0


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


class CubeValidatesInput(Function):
    """``x ** 3`` that first checks ``torch.isfinite(x).all()`` in Python.

    Correct in eager, but the ``if`` on a tensor is data-dependent control
    flow: a graph break under ``torch.compile``, an error with ``fullgraph=True``.
    """

    @staticmethod
    def forward(ctx, x):
        if not torch.isfinite(x).all():
            raise ValueError("CubeValidatesInput needs finite inputs")
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * 3 * x**2


def _define(name, fn, fake=None, backward=None, setup_context=None, mutates_args=()):
    """``torch.library.custom_op`` once per process: a re-import returns the existing op."""
    from torch._library import custom_ops

    qualname = f"{NAMESPACE}::{name}"
    existing = getattr(custom_ops, "OPDEFS", {}).get(qualname)
    if existing is None:  # torch without OPDEFS: the operator itself, if registered before
        existing = getattr(getattr(torch.ops, NAMESPACE), name, None)
    if existing is not None:
        return existing
    op = torch.library.custom_op(qualname, mutates_args=mutates_args)(fn)
    if fake is not None:
        op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op


def _row_sum(x: Tensor) -> Tensor:
    return x.sum(-1) * 2


def _row_sum_setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape


def _row_sum_backward(ctx, grad):
    return (grad * 2).unsqueeze(-1).expand(ctx.shape)


_row_sum_kernel = _define("row_sum", _row_sum, fake=lambda x: x.new_empty(x.shape[:-1]),
                          backward=_row_sum_backward, setup_context=_row_sum_setup)
_row_sum_bad_fake_kernel = _define("row_sum_default_dtype_fake", _row_sum,
                                   fake=lambda x: torch.empty(x.shape[:-1]),
                                   backward=_row_sum_backward, setup_context=_row_sum_setup)


def scaled_row_sum(x):
    """``2 * x.sum(-1) * x.amax(-1)`` on the custom op ``row_sum``, whose fake impl is right."""
    return _row_sum_kernel(x) * x.amax(-1)


def scaled_row_sum_default_dtype_fake(x):
    """Bug: the kernel's fake impl is ``torch.empty(shape)``: default dtype, not ``x.dtype``.

    Eager never runs the fake impl; under torch.compile inductor plans the
    buffers from it and reads float64 results as float32.
    """
    return _row_sum_bad_fake_kernel(x) * x.amax(-1)


# ---------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------


def _scaled_sin(x: Tensor, scale: float) -> Tensor:
    return torch.sin(x * scale)


def _scaled_sin_in_place(x: Tensor, scale: float) -> Tensor:
    x.mul_(scale)  # mutates its input, but mutates_args=() says it does not
    return torch.sin(x)


def _scaled_sin_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * torch.cos(x * ctx.scale), None


def _scaled_sin_fake(x, scale):
    return torch.empty_like(x)


scaled_sin = _define("scaled_sin", _scaled_sin, fake=_scaled_sin_fake,
                     backward=_scaled_sin_backward, setup_context=_scaled_sin_setup)
"""``sin(x * scale)`` as a ``torch.library.custom_op`` with a fake impl and an autograd formula."""

scaled_sin_no_fake = _define("scaled_sin_no_fake", _scaled_sin,
                             backward=_scaled_sin_backward, setup_context=_scaled_sin_setup)
"""Bug: no fake impl, so torch.compile, export and FakeTensor tracing cannot use it."""

scaled_sin_mutates_input = _define("scaled_sin_mutates_input", _scaled_sin_in_place, fake=_scaled_sin_fake,
                                   backward=_scaled_sin_backward, setup_context=_scaled_sin_setup)
"""Bug: scales ``x`` in place although its schema declares no mutated argument."""

row_sum = _row_sum_kernel
"""``2 * x.sum(-1)`` as a ``torch.library.custom_op`` whose fake impl keeps the input's dtype (``x.new_empty``)."""

row_sum_default_dtype_fake = _row_sum_bad_fake_kernel
"""Bug: the fake impl allocates with ``torch.empty(shape)``, in the default dtype: right for float32 samples only."""


# ---------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------


class LinearHalfMatmul(Function):
    """Bug: ``input @ weight.T + bias`` whose float32 "fast path" runs the matmul in bfloat16.

    Looks like float32 from outside (float32 in, float32 out) but every
    output carries a 16-bit rounding error; float64 inputs take the exact
    path, so float64 checks (gradcheck, reference) never see it. Backward is
    full precision.
    """

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        if input.dtype == torch.float32:
            output = (input.to(torch.bfloat16) @ weight.to(torch.bfloat16).T).to(input.dtype)
        else:
            output = input @ weight.T
        return output + bias

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        return grad_output @ weight, flat_grad.T @ input.reshape(-1, input.shape[-1]), flat_grad.sum(0)


class NaiveVariance(Function):
    """Variance over the last dim as ``mean(x^2) - mean(x)^2``.

    Loses digits to cancellation when the mean is large against the spread,
    exactly as much as :func:`naive_variance_reference` does: imprecise, yet
    correct in the sense the precision check's error budget means.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x * x).mean(-1) - x.mean(-1) ** 2

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        n = x.shape[-1]
        return grad_output.unsqueeze(-1) * 2 * (x - x.mean(-1, keepdim=True)) / n


def naive_variance_reference(x):
    return (x * x).mean(-1) - x.mean(-1) ** 2


# ---------------------------------------------------------------------------
# Extreme values
# ---------------------------------------------------------------------------


class NaiveSoftmax(Function):
    """Bug: softmax as ``exp(x) / exp(x).sum()``; ``exp`` overflows for inputs above ~88 in float32."""

    @staticmethod
    def forward(ctx, x):
        e = torch.exp(x)
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return y * (grad_output - (grad_output * y).sum(-1, keepdim=True))


class StableSoftmax(NaiveSoftmax):
    """Softmax that subtracts the row maximum before ``exp``: nothing overflows."""

    @staticmethod
    def forward(ctx, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y


def softmax_reference(x):
    return torch.softmax(x, -1)
