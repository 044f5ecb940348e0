"""Mixed-precision training ops: bfloat16 activations, float32 master weights, with a planted-bug twin.

* :class:`MixedPrecisionLinear` -- ``x @ weight.T + bias`` where ``x`` is
  bfloat16 and ``weight``/``bias`` are float32 master weights: forward runs
  in the activations' dtype, backward accumulates the weight and bias
  gradients in the weights' own dtype and returns them in it.
* :class:`MixedPrecisionLinearBf16WeightGrad` -- BUG: returns the weight and
  bias gradients in bfloat16. Autograd's engine casts them to float32
  without a word, so the master weights train on 3 significant digits; only
  what backward itself returned shows it (the grad_metadata check).

Both run in any single dtype too (every tensor float64, say), where they
agree: the bug exists only with mixed dtypes, as in real training.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "MixedPrecisionLinear",
    "MixedPrecisionLinearBf16WeightGrad",
    "mixed_linear_reference",
    "mixed_linear_samples",
]


class MixedPrecisionLinear(Function):
    """``x @ weight.T + bias`` in ``x``'s dtype; gradients of the master weights in their own dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = bias.dtype
        return x @ weight.to(x.dtype).T + bias.to(x.dtype)

    @classmethod
    def backward(cls, ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight.to(grad.dtype)
        grad_weight, grad_bias = cls.master_grads(grad, x, weight.dtype, ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias

    @staticmethod
    def master_grads(grad, x, weight_dtype, bias_dtype):
        return grad.to(weight_dtype).T @ x.to(weight_dtype), grad.to(bias_dtype).sum(0)


class MixedPrecisionLinearBf16WeightGrad(MixedPrecisionLinear):
    """BUG: the master weights' gradients computed and returned in the activations' dtype (bfloat16)."""

    @staticmethod
    def master_grads(grad, x, weight_dtype, bias_dtype):
        return grad.T @ x, grad.sum(0)


def mixed_linear_reference(x, weight, bias):
    return torch.nn.functional.linear(x, weight.to(x.dtype), bias.to(x.dtype))


def mixed_linear_samples(generator=None):
    """bfloat16 activations, float32 weight and bias."""

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator).to(dtype)

    return [(randn(6, 8, dtype=torch.bfloat16), randn(4, 8), randn(4))]
