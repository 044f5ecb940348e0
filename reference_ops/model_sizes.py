"""A small attention layer whose ops the architecture fixes in some dims, for the model scan's sizes.

* :class:`RotaryEmbedding` is the rotary position embedding of Hugging Face
  models (``x * cos + rotate_half(x) * sin``) with a hand-written backward
  written for even head dims only: its transpose of ``rotate_half`` swaps
  two equal halves. It is correct wherever a model calls it (the head dim is
  fixed by the model's config, and even), and wrong at an odd head dim,
  which no such model produces.
* :class:`ChunkedCumsum` is a running sum over the sequence computed chunk by
  chunk (as chunked linear-attention and state-space kernels do), and
  :class:`ChunkedCumsumDropsTail` its planted twin: its backward loops over
  ``length // CHUNK`` chunks, so the last, partial chunk of a sequence length
  that is not a multiple of 4 gets no gradient. The model calls it at such
  lengths whenever its input has one.

:class:`RotaryAttention` uses both: at a sequence length of 8 every check
passes on the calls it makes; run at other input sizes, the model gives the
rotary embedding other batches and lengths, never another head dim, and
gives the running sum tail lengths, where the planted twin is wrong.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd import Function

__all__ = ["RotaryEmbedding", "ChunkedCumsum", "ChunkedCumsumDropsTail", "RotaryAttention", "rotary_inputs",
           "rotary_reference", "cumsum_reference"]

CHUNK = 4


def _rotate_half(x):
    """Hugging Face's ``rotate_half``: ``(x1, x2) -> (-x2, x1)`` on the two halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(Function):
    """``x * cos + rotate_half(x) * sin``; ``cos`` and ``sin`` are ``(length, head_dim)`` tables (constants)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        turned = grad * sin
        half = turned.shape[-1] // 2  # rotate_half's transpose, (y1, y2) -> (y2, -y1), for two equal halves
        return grad * cos + torch.cat((turned[..., half:], -turned[..., :half]), dim=-1), None, None


def rotary_reference(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def rotary_tables(positions, head_dim, base=10000.0):
    """``(cos, sin)`` of shape ``(positions, head_dim)``, each half the same frequencies (as Hugging Face builds
    them)."""
    frequencies = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * frequencies[None]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class ChunkedCumsum(Function):
    """A running sum over dim -2 (the sequence), computed chunk by chunk of CHUNK positions."""

    @staticmethod
    def forward(ctx, x):
        length = x.shape[-2]
        out = torch.empty_like(x)
        carry = torch.zeros_like(x[..., :1, :])
        for start in range(0, length, CHUNK):
            stop = min(start + CHUNK, length)
            out[..., start:stop, :] = carry + x[..., start:stop, :].cumsum(-2)
            carry = out[..., stop - 1:stop, :]
        return out

    @staticmethod
    def backward(ctx, grad):
        return _suffix_sums(grad, -(-grad.shape[-2] // CHUNK))


class ChunkedCumsumDropsTail(ChunkedCumsum):
    """Planted bug: the backward covers ``length // CHUNK`` chunks, so a tail shorter than a chunk gets no
    gradient (and the chunks before it miss its share)."""

    @staticmethod
    def backward(ctx, grad):
        return _suffix_sums(grad, grad.shape[-2] // CHUNK)  # BUG: floor division leaves the tail out


def _suffix_sums(grad, chunks):
    """The running sum's backward, a running sum from the end, over the first ``chunks`` chunks."""
    length = grad.shape[-2]
    grad_x = torch.zeros_like(grad)
    carry = torch.zeros_like(grad[..., :1, :])
    for index in reversed(range(chunks)):
        start, stop = index * CHUNK, min(index * CHUNK + CHUNK, length)
        suffix = grad[..., start:stop, :].flip(-2).cumsum(-2).flip(-2) + carry
        grad_x[..., start:stop, :] = suffix
        carry = suffix[..., :1, :]
    return grad_x


def cumsum_reference(x):
    return x.cumsum(-2)


class RotaryAttention(nn.Module):
    """Causal attention with rotary queries and keys, plus a running mean of the values: ``(batch, length, hidden)``
    in and out. The head dim, ``hidden // heads``, is fixed by the config; lengths up to ``max_positions``."""

    def __init__(self, hidden=12, heads=2, max_positions=64, cumsum=ChunkedCumsum):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)
        cos, sin = rotary_tables(max_positions, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.cumsum = cumsum

    def forward(self, x):
        batch, length, hidden = x.shape

        def heads(t):
            return t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

        cos, sin = self.cos[:length], self.sin[:length]
        q = RotaryEmbedding.apply(heads(self.query(x)), cos, sin)
        k = RotaryEmbedding.apply(heads(self.key(x)), cos, sin)
        values = self.value(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        attended = (scores.masked_fill(causal, float("-inf")).softmax(-1) @ heads(values)).transpose(1, 2)
        positions = torch.arange(1, length + 1, device=x.device, dtype=x.dtype)[:, None]
        running_mean = self.cumsum.apply(values) / positions
        return self.out(attended.reshape(batch, length, hidden) + running_mean)


def rotary_inputs(batch=2, length=8, hidden=12, dtype=torch.float32):
    """One call's inputs, ``(x,)``: a length of 8, two whole chunks."""
    return (torch.randn(batch, length, hidden, dtype=dtype),)
