"""Ops written the way float32-only kernels are, with planted-bug twins.

Most CUDA and Triton kernels accept only float32 (or 16-bit) inputs: some
raise on float64, some compute in float32 whatever they are given. These
ops imitate both on the CPU, around one formula with a product rule,
``gated(x, w) = x * tanh(w * x)``:

* :class:`GatedFloat32Only` raises on anything but float32, as a kernel's
  dtype dispatch does;
* :class:`GatedComputesInFloat32` accepts any dtype, computes in float32 and
  returns float32;
* :class:`GatedMixedPrecision` takes and returns any dtype but computes
  ``tanh`` in float32 and the product in the input's dtype, as kernels that
  load an activation ``.to(float32)`` and multiply by a tensor left in its
  own dtype do (liger-kernel's SwiGLU): for float64 inputs its outputs are
  float64 values, not float32 ones, yet they move with inputs only where
  float32 resolves the move;
* :class:`GatedFloat32OnlySilent` computes garbage for float64 without
  raising (a kernel that reinterprets its input): only ``dtypes=`` on the
  marker can say what it supports.

Their backward is built from differentiable torch ops, so the second
derivative exists. ``*DroppedProductTerm`` twins forget the
``x * w * (1 - tanh^2)`` term of ``d/dx``.

:class:`SwishBfloat16Only` is a bfloat16-only kernel (SiLU, ``x *
sigmoid(x)``), the dtype most fused training kernels are written for; its
twin :class:`SwishBfloat16OnlyGradTooLarge` returns a gradient 1.5 times
too large, which central differences in bfloat16 must still see without a
reference; :class:`SwishBfloat16OnlyDroppedTerm` forgets the
``x * s * (1 - s)`` term, an error small where ``|x|`` is small.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "GatedFloat32Only",
    "GatedFloat32OnlyDroppedProductTerm",
    "GatedComputesInFloat32",
    "GatedComputesInFloat32DroppedProductTerm",
    "GatedFloat32OnlySilent",
    "GatedMixedPrecision",
    "GatedMixedPrecisionDroppedProductTerm",
    "SwishBfloat16Only",
    "SwishBfloat16OnlyGradTooLarge",
    "SwishBfloat16OnlyDroppedTerm",
    "swish_reference",
    "gated_reference",
    "gated_samples",
]


def _require_float32(*tensors):
    for tensor in tensors:
        if tensor.dtype != torch.float32:
            raise RuntimeError(f"gated_kernel: only float32 is supported, got {tensor.dtype}")


def _gated_grads(x, w, grad, drop_product_term=False, t=None):
    """Gradients of ``x * t`` with ``t = tanh(w * x)`` (``t``: that tanh when computed elsewhere)."""
    t = torch.tanh(w * x) if t is None else t
    d_tanh = 1 - t * t
    grad_x = grad * (t if drop_product_term else t + x * w * d_tanh)
    grad_w = grad * x * x * d_tanh
    return grad_x, grad_w


class GatedFloat32Only(Function):
    """``x * tanh(w * x)``; raises unless every input is float32."""

    drop_product_term = False

    @staticmethod
    def forward(ctx, x, w):
        _require_float32(x, w)
        ctx.save_for_backward(x, w)
        return x * torch.tanh(w * x)

    @classmethod
    def backward(cls, ctx, grad):
        x, w = ctx.saved_tensors
        return _gated_grads(x, w, grad, cls.drop_product_term)


class GatedFloat32OnlyDroppedProductTerm(GatedFloat32Only):
    """BUG: ``d/dx`` forgets the ``x * w * (1 - tanh^2)`` term of the product rule."""

    drop_product_term = True


class GatedComputesInFloat32(Function):
    """``x * tanh(w * x)`` computed and returned in float32 whatever the input dtype."""

    drop_product_term = False

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)  # the inputs themselves: casts inside forward are not recorded
        x32, w32 = x.float(), w.float()
        return x32 * torch.tanh(w32 * x32)

    @classmethod
    def backward(cls, ctx, grad):
        x, w = ctx.saved_tensors
        grad_x, grad_w = _gated_grads(x.float(), w.float(), grad.float(), cls.drop_product_term)
        return grad_x, grad_w


class GatedComputesInFloat32DroppedProductTerm(GatedComputesInFloat32):
    """BUG: ``d/dx`` forgets the ``x * w * (1 - tanh^2)`` term of the product rule."""

    drop_product_term = True


class GatedMixedPrecision(Function):
    """``x * tanh(w * x)``: ``tanh`` in float32, the product and the gradients' products in the input's dtype."""

    drop_product_term = False

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * _tanh_in_float32(w * x)

    @classmethod
    def backward(cls, ctx, grad):
        x, w = ctx.saved_tensors
        return _gated_grads(x, w, grad, cls.drop_product_term, t=_tanh_in_float32(w * x))


def _tanh_in_float32(z):
    return torch.tanh(z.float()).to(z.dtype)


class GatedMixedPrecisionDroppedProductTerm(GatedMixedPrecision):
    """BUG: ``d/dx`` forgets the ``x * w * (1 - tanh^2)`` term of the product rule."""

    drop_product_term = True


class GatedFloat32OnlySilent(Function):
    """``x * tanh(w * x)`` for float32; for other dtypes a wrong answer, no error (declare ``dtypes=``)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        out = x * torch.tanh(w * x)
        return out if x.dtype == torch.float32 else out * 0.5

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return _gated_grads(x, w, grad)


def gated_reference(x, w):
    return x * torch.tanh(w * x)


def gated_samples(generator=None, dtype=torch.float32):
    """A 3x4 pair and a 1-D pair of 7, values of order one."""
    r = lambda *s: torch.randn(*s, generator=generator, dtype=dtype)  # noqa: E731
    return [(r(3, 4), r(3, 4)), (r(7), 0.5 * r(7))]


def _swish_grad(x, grad, scale=1.0):
    x32 = x.float()
    s = torch.sigmoid(x32)
    return (grad.float() * (s + x32 * s * (1 - s)) * scale).to(torch.bfloat16)


class SwishBfloat16Only(Function):
    """``x * sigmoid(x)`` for bfloat16 only, computed in float32 and rounded, as fused kernels do."""

    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.bfloat16:
            raise RuntimeError(f"swish_kernel: only bfloat16 is supported, got {x.dtype}")
        ctx.save_for_backward(x)
        x32 = x.float()
        return (x32 * torch.sigmoid(x32)).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _swish_grad(x, grad)


class SwishBfloat16OnlyGradTooLarge(SwishBfloat16Only):
    """BUG: the gradient is 1.5 times the derivative (a scale applied twice)."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _swish_grad(x, grad, scale=1.5)


class SwishBfloat16OnlyDroppedTerm(SwishBfloat16Only):
    """BUG: the derivative taken as ``sigmoid(x)``, without the ``x * s * (1 - s)`` term."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad.float() * torch.sigmoid(x.float())).to(torch.bfloat16)


def swish_reference(x):
    return torch.nn.functional.silu(x)

