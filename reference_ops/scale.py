"""Hand-written Functions of the shapes real kernels have, for checks at scale (0.25M to 4M elements).

One per op family the derivative checks must stay cheap on:

* :class:`Gelu` -- elementwise (tanh approximation);
* :class:`LayerNormAffine` -- a row-wise reduction with a weight and a bias;
* :class:`RowSoftmax` -- a row-wise reduction;
* :class:`Attention` -- batched matmuls around a softmax, ``softmax(q k^T / sqrt(d)) v``;
* :class:`reference_ops.LinearFunction` -- a linear layer (in :mod:`reference_ops.functions`).

Each backward is written in differentiable torch ops from the saved inputs,
so double backward is right. The planted-bug twins write backward the way a
fused kernel's wrapper often does, from intermediates saved in forward
(``rstd``, the probabilities): forward runs without a graph, so those tensors
are constants to autograd, first derivatives stay right and second ones are
wrong.

* :class:`LayerNormAffineSavesRstd` -- backward from the forward's ``rstd``;
* :class:`AttentionSavesProbabilities` -- backward from the forward's probabilities.

:data:`FAMILIES` gives each family's op, reference and samples at a number of
elements per argument (``benchmarks/bench_battery_scale.py``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd import Function

from .functions import LinearFunction, linear_reference

__all__ = [
    "Gelu",
    "LayerNormAffine",
    "LayerNormAffineSavesRstd",
    "RowSoftmax",
    "Attention",
    "AttentionSavesProbabilities",
    "gelu_reference",
    "layer_norm_reference",
    "softmax_reference",
    "attention_reference",
    "Family",
    "FAMILIES",
]

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
LAYER_NORM_EPS = 1e-5
ROW = 1024  # row width of the row-wise ops and GELU's samples
LINEAR_FEATURES = 512  # in and out features of the linear layer
HEADS_LENGTH, HEAD_DIM = 512, 64  # attention: sequence length and head dimension (batch: 8 to 128 heads)


class Gelu(Function):
    """GELU, tanh approximation: ``x/2 (1 + tanh(c (x + 0.044715 x^3)))``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        inner = SQRT_2_OVER_PI * (x + CUBIC * x ** 3)
        t = torch.tanh(inner)
        d_inner = SQRT_2_OVER_PI * (1 + 3 * CUBIC * x * x)
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)


def _gelu(x):
    return 0.5 * x * (1 + torch.tanh(SQRT_2_OVER_PI * (x + CUBIC * x ** 3)))


def gelu_reference(x):
    return F.gelu(x, approximate="tanh")


def _normalise(x):
    centred = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt((centred * centred).mean(-1, keepdim=True) + LAYER_NORM_EPS)
    return centred * rstd, rstd


def _layer_norm_grads(grad, y, rstd, weight):
    gy = grad * weight
    grad_x = rstd * (gy - gy.mean(-1, keepdim=True) - y * (gy * y).mean(-1, keepdim=True))
    rows = grad.reshape(-1, grad.shape[-1])
    return grad_x, (rows * y.reshape(rows.shape)).sum(0), rows.sum(0)


class LayerNormAffine(Function):
    """Layer norm over the last dimension with a weight and a bias; backward recomputes from ``x``."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return _normalise(x)[0] * weight + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        y, rstd = _normalise(x)
        return _layer_norm_grads(grad, y, rstd, weight)


class LayerNormAffineSavesRstd(LayerNormAffine):
    """BUG: backward uses the ``rstd`` and normalised ``y`` saved in forward, constants to autograd: the second
    derivative misses their dependence on ``x``."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        y, rstd = _normalise(x)
        ctx.save_for_backward(y, rstd, weight)
        return y * weight + bias

    @staticmethod
    def backward(ctx, grad):
        y, rstd, weight = ctx.saved_tensors
        return _layer_norm_grads(grad, y, rstd, weight)


def layer_norm_reference(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps=LAYER_NORM_EPS)


class RowSoftmax(Function):
    """Softmax over the last dimension; backward recomputes the probabilities from ``x``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        p = torch.softmax(x, -1)
        return p * (grad - (grad * p).sum(-1, keepdim=True))


def softmax_reference(x):
    return torch.softmax(x, -1)


def _probabilities(q, k):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)


def _attention_grads(grad, q, k, v, p):
    grad_v = p.transpose(-1, -2) @ grad
    grad_p = grad @ v.transpose(-1, -2)
    grad_scores = p * (grad_p - (grad_p * p).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
    return grad_scores @ k, grad_scores.transpose(-1, -2) @ q, grad_v


class Attention(Function):
    """``softmax(q k^T / sqrt(d)) v`` over batched ``(B, T, d)`` arguments; backward recomputes the probabilities
    in the saved arguments' dtype (under torch.autocast ``grad`` comes in the 16-bit dtype of forward's matmul)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return _probabilities(q, k) @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return _attention_grads(grad.to(q.dtype), q, k, v, _probabilities(q, k))


class AttentionSavesProbabilities(Attention):
    """BUG: backward uses the probabilities saved in forward, a constant to autograd: the second derivatives
    through them (w.r.t. ``q`` and ``k``) are missing."""

    @staticmethod
    def forward(ctx, q, k, v):
        p = _probabilities(q, k)
        ctx.save_for_backward(q, k, v, p)
        return p @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        return _attention_grads(grad, q, k, v, p)


def attention_reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


class Family(NamedTuple):
    """An op family: the op, its reference, and ``samples(elements, generator)`` with about ``elements``
    elements in its largest argument."""

    op: Callable
    reference: Callable
    samples: Callable


def _rows(elements, width):
    return max(1, elements // width)


def _gelu_samples(elements, generator=None):
    return [(torch.randn(_rows(elements, ROW), ROW, generator=generator),)]


def _layer_norm_samples(elements, generator=None):
    return [(torch.randn(_rows(elements, ROW), ROW, generator=generator),
             torch.rand(ROW, generator=generator) + 0.5, torch.randn(ROW, generator=generator))]


def _softmax_samples(elements, generator=None):
    return [(torch.randn(_rows(elements, ROW), ROW, generator=generator),)]


def _attention_samples(elements, generator=None):
    batch = _rows(elements, HEADS_LENGTH * HEAD_DIM)
    return [tuple(torch.randn(batch, HEADS_LENGTH, HEAD_DIM, generator=generator) for _ in range(3))]


def _linear_samples(elements, generator=None):
    features = LINEAR_FEATURES
    return [(torch.randn(_rows(elements, features), features, generator=generator),
             torch.randn(features, features, generator=generator) / math.sqrt(features),
             torch.randn(features, generator=generator))]


FAMILIES = {
    "gelu": Family(Gelu, gelu_reference, _gelu_samples),
    "layer_norm": Family(LayerNormAffine, layer_norm_reference, _layer_norm_samples),
    "softmax": Family(RowSoftmax, softmax_reference, _softmax_samples),
    "attention": Family(Attention, attention_reference, _attention_samples),
    "linear": Family(LinearFunction, linear_reference, _linear_samples),
}
"""Family name -> ``Family(op, reference, samples)``; ``samples(elements, generator)`` lists argument tuples."""
