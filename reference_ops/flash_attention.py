"""Attention the way production kernels compute it (FlashAttention-2), and a twin that saturates wrongly.

:class:`FlashAttention` computes ``softmax(q k^T / sqrt(d)) v`` over
``(..., T, d)`` arguments as FlashAttention-2 does, in plain torch: the
forward streams over blocks of ``KEY_BLOCK`` keys with a running max and sum
(online softmax) and saves the output ``o`` and each row's log-sum-exp
``lse``, never the probabilities; the backward recomputes them as
``P = exp(S - lse)`` and takes the softmax's correction from
``delta = rowsum(dO * O)`` instead of ``rowsum(dP * P)``. It is correct, and
its float32 error at inputs of |x| ~ 177 is what any float32 attention has
there (torch's own is about as far from float64): a yardstick only a
``reference=`` provides.

:class:`FlashAttentionUnshiftedExp` -- BUG: the backward recomputes the
probabilities as ``exp(S) / exp(lse)``, the same numbers on paper; once a
score passes 88.7, ``exp(S)`` overflows float32 and the gradients are NaN.
Right at unit-sized samples, where scores are a few units.

:func:`attention_reference` is torch's own ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

__all__ = [
    "KEY_BLOCK",
    "FlashAttention",
    "FlashAttentionUnshiftedExp",
    "attention_reference",
    "attention_samples",
]

KEY_BLOCK = 16  # keys per block of the forward's online softmax


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _forward(q, k, v):
    """(o, lse): the output and each row's log-sum-exp, streaming over blocks of keys."""
    rows = q.shape[:-1]
    running_max = q.new_full(rows + (1,), float("-inf"))
    running_sum = q.new_zeros(rows + (1,))
    acc = q.new_zeros(rows + v.shape[-1:])
    for start in range(0, k.shape[-2], KEY_BLOCK):
        s = _scores(q, k[..., start:start + KEY_BLOCK, :])
        new_max = torch.maximum(running_max, s.amax(-1, keepdim=True))
        rescale = torch.exp(running_max - new_max)
        p = torch.exp(s - new_max)
        running_sum = running_sum * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + p @ v[..., start:start + KEY_BLOCK, :]
        running_max = new_max
    return acc / running_sum, running_max + torch.log(running_sum)


class FlashAttention(Function):
    """``softmax(q k^T / sqrt(d)) v``: forward saves ``o`` and ``lse``; backward recomputes ``P = exp(S - lse)``
    and uses ``delta = rowsum(dO * O)``. Once differentiable, as FlashAttention's own Function is: ``o`` and
    ``lse`` are saved without a graph."""

    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = _forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.probabilities = getattr(ctx, "_forward_cls", FlashAttention).probabilities
        return o

    @staticmethod
    def probabilities(scores, lse):
        return torch.exp(scores - lse)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        p = ctx.probabilities(_scores(q, k), lse)
        grad_v = p.transpose(-1, -2) @ grad
        grad_p = grad @ v.transpose(-1, -2)
        delta = (grad * o).sum(-1, keepdim=True)
        grad_s = p * (grad_p - delta) / math.sqrt(q.shape[-1])
        return grad_s @ k, grad_s.transpose(-1, -2) @ q, grad_v


class FlashAttentionUnshiftedExp(FlashAttention):
    """BUG: backward recomputes the probabilities as ``exp(S) / exp(lse)``: NaN once a score overflows ``exp``."""

    @staticmethod
    def probabilities(scores, lse):
        return torch.exp(scores) / torch.exp(lse)


def attention_reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def attention_samples(generator=None):
    """One (heads, T, d) sample: 2 heads, 40 queries and keys (two and a half key blocks), head dim 8."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return [(randn(2, 40, 8), randn(2, 40, 8), randn(2, 40, 8))]
