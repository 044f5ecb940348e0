"""Ops that are right when called plainly and wrong only where a training step calls them, with correct twins.

Activation checkpointing (the checkpoint check):

* :class:`CountsCalls` -- correct; counts its calls on the class, a statistic nothing reads.
* :class:`DropoutOwnGenerator` -- draws its mask from a ``torch.Generator`` of its own, which checkpoint
  does not restore: the recompute draws another mask. Its correct twin is
  :class:`reference_ops.random_ops.Dropout`, on torch's global generator.
* :class:`NoiseFromNumpy` -- multiplicative noise from numpy's global generator: recomputed otherwise.
* :class:`AnnealedByStepCount` -- a temperature annealed by a step counter forward advances on every
  differentiated call: the recompute is one step later.
* :class:`TokenDropOwnGenerator` -- drops random rows (its own generator) and saves the kept rows' indices:
  the recompute saves another number of them, and torch's recompute check raises.

``samples(generator)`` gives each op's samples; every op here takes one ``x`` of shape ``(6, 8)``.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "AnnealedByStepCount",
    "CountsCalls",
    "DropoutOwnGenerator",
    "NoiseFromNumpy",
    "TokenDropOwnGenerator",
    "samples",
]


def samples(generator=None):
    return [(torch.randn(6, 8, generator=generator),)]


# ---------------------------------------------------------------------------
# Activation checkpointing
# ---------------------------------------------------------------------------


class CountsCalls(Function):
    """``x * tanh(x)``; every call adds one to a counter on the class that nothing reads: a harmless side effect."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        CountsCalls.calls += 1
        ctx.save_for_backward(x)
        return x * torch.tanh(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        t = torch.tanh(x)
        return grad * (t + x * (1 - t * t))


class DropoutOwnGenerator(Function):
    """Bug under checkpoint: dropout with its mask from a generator of its own, saved for backward. Correct plainly;
    recomputed under checkpoint, it draws another mask, and backward uses that one."""

    generator = torch.Generator().manual_seed(0)
    p = 0.3

    @staticmethod
    def forward(ctx, x):
        keep = torch.rand(x.shape, generator=DropoutOwnGenerator.generator, dtype=torch.float32, device=x.device)
        keep = (keep >= DropoutOwnGenerator.p).to(x.dtype) / (1 - DropoutOwnGenerator.p)
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep


class NoiseFromNumpy(Function):
    """Bug under checkpoint: ``x * (1 + 0.1 * eps)`` with ``eps`` from numpy's global generator, saved for backward."""

    @staticmethod
    def forward(ctx, x):
        import numpy

        scale = 1 + 0.1 * torch.from_numpy(numpy.random.standard_normal(tuple(x.shape))).to(x.device, x.dtype)
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale


class AnnealedByStepCount(Function):
    """Bug under checkpoint: ``softmax(x / tau)`` with ``tau`` annealed by a step counter that forward advances on
    every call that will be differentiated. Correct plainly (each call uses the tau it saved); the recompute under
    checkpoint advances the counter again and computes with the next tau."""

    step = 0

    @staticmethod
    def forward(ctx, x):
        if any(ctx.needs_input_grad):
            AnnealedByStepCount.step += 1
        tau = 1.0 + 1.0 / (1 + AnnealedByStepCount.step % 7)
        y = torch.softmax(x / tau, -1)
        ctx.tau = tau
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True)) / ctx.tau


class TokenDropOwnGenerator(Function):
    """Bug under checkpoint: drops random rows of ``x`` (a generator of its own) and saves the kept rows' indices;
    the recompute keeps another number of rows, and torch's recompute check raises a CheckpointError."""

    generator = torch.Generator().manual_seed(1)

    @staticmethod
    def forward(ctx, x):
        keep = torch.rand(x.shape[0], generator=TokenDropOwnGenerator.generator) >= 0.5
        kept = keep.nonzero().squeeze(1).to(x.device)
        ctx.save_for_backward(kept)
        ctx.rows = x.shape[0]
        out = torch.zeros_like(x)
        out[kept] = x[kept]
        return out

    @staticmethod
    def backward(ctx, grad):
        (kept,) = ctx.saved_tensors
        out = torch.zeros_like(grad)
        out[kept] = grad[kept]
        return out
