"""Dropout drawing its mask from torch's global random generator, as ``torch.nn.functional.dropout`` does.

Every run of a check that compares runs starts from one seed, so a mask
drawn in a fixed order and dtype (:class:`DropoutFixedDraw`, whose
``torch.rand`` takes the shape and float32 whatever the input) is the same
in every run. A mask drawn by ``torch.rand_like`` differs in another dtype,
layout or device: a check failing there runs again with the op's draws
fixed by position (``engine/random_draws``), and judges it with its masks
alike.

* :class:`Dropout` -- correct; ``torch.rand_like`` draws in the input's dtype and memory order.
* :class:`DropoutFixedDraw` -- correct; the mask is drawn in float32, in row-major order.
* :class:`DropoutBackwardIgnoresMask` -- backward passes grad_output through unmasked (gradcheck catches it).
* :class:`DropoutFixedDrawReadsGradContiguous` -- backward reads grad_output as if it were contiguous
  (noncontiguous catches it).

Two runs of an op drawing random numbers differ by design: the determinism
check judges it with torch's generator reseeded before each run, and notes it.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "Dropout",
    "DropoutFixedDraw",
    "DropoutBackwardIgnoresMask",
    "DropoutFixedDrawReadsGradContiguous",
    "dropout_samples",
]


class Dropout(Function):
    """``x * keep / (1 - p)`` with ``keep`` drawn from the global generator by ``torch.rand_like(x)``."""

    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep, None


class DropoutFixedDraw(Dropout):
    """The mask drawn in float32 and row-major order whatever the input's dtype and layout."""

    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand(x.shape, dtype=torch.float32, device=x.device) >= p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(keep)
        return x * keep


class DropoutBackwardIgnoresMask(Dropout):
    """Bug: backward passes grad_output through as if no element had been dropped."""

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class DropoutFixedDrawReadsGradContiguous(DropoutFixedDraw):
    """Bug: backward reads grad_output's memory as if it were contiguous (a kernel indexing ``data_ptr()``)."""

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        flat = torch.as_strided(grad, grad.shape, [grad.shape[-1], 1], grad.storage_offset())
        return flat * keep, None


def dropout_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator), 0.25)]
