"""Ops whose float64 differences cannot see their derivative, with zero-gradient twins.

Each takes and returns any dtype but computes below float64, as kernels
that load their inputs ``.to(float32)`` (or ``.to(bfloat16)``) and cast
back do. A derivative check in float64 then differences quantised outputs;
in the low dtype its steps may be coarser than the output's own scale:

* :class:`Float32FastSine` is ``sin(50 x)`` at ``|x|`` up to a few hundred,
  computed in float32: over the step central differences need in float32
  (about ``0.005 max|x|``) the output turns many times, and the differences
  average its slopes to nearly zero;
* :class:`Float32LogSumExp` is a row ``logsumexp`` in float32, whose float64
  one-sided differences over a float64 step are 0 or one float32 ulp: they
  read as kinks almost everywhere;
* :class:`Bfloat16ComputedTanh` is ``tanh`` computed in bfloat16, whose
  float64 outputs do not move at all over a float64 step.

A correct backward must not fail there; the ``*ZeroGrad`` twins, whose
backward returns zeros, must never pass: each passed gradcheck before
(the zero read as the average slope, as a value between two kink slopes,
or as the flat float64 differences).
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "Float32FastSine",
    "Float32FastSineZeroGrad",
    "Float32LogSumExp",
    "Float32LogSumExpZeroGrad",
    "Bfloat16ComputedTanh",
    "Bfloat16ComputedTanhZeroGrad",
    "fast_sine_samples",
    "log_sum_exp_samples",
    "tanh_samples",
]

FREQUENCY = 50.0


class Float32FastSine(Function):
    """``sin(50 x)``, forward and backward computed in float32 whatever the input dtype."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(FREQUENCY * x.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad.float() * FREQUENCY * torch.cos(FREQUENCY * x.float())).to(grad.dtype)


class Float32FastSineZeroGrad(Float32FastSine):
    """BUG: the backward returns zeros."""

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


class Float32LogSumExp(Function):
    """``logsumexp`` over the last dimension, computed in float32 whatever the input dtype."""

    @staticmethod
    def forward(ctx, x):
        out = torch.logsumexp(x.float(), dim=-1)
        ctx.save_for_backward(x, out)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        weights = torch.exp(x.float() - out.unsqueeze(-1))
        return (grad.float().unsqueeze(-1) * weights).to(grad.dtype)


class Float32LogSumExpZeroGrad(Float32LogSumExp):
    """BUG: the backward returns zeros."""

    @staticmethod
    def backward(ctx, grad):
        x, _ = ctx.saved_tensors
        return torch.zeros_like(x)


class Bfloat16ComputedTanh(Function):
    """``tanh`` computed in bfloat16 whatever the input dtype (a kernel that loads bfloat16 tiles)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x.to(torch.bfloat16)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        t = torch.tanh(x.to(torch.bfloat16)).float()
        return (grad.float() * (1 - t * t)).to(grad.dtype)


class Bfloat16ComputedTanhZeroGrad(Bfloat16ComputedTanh):
    """BUG: the backward returns zeros."""

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


def fast_sine_samples(generator=None):
    return [(torch.randn(64, generator=generator) * 100,)]


def log_sum_exp_samples(generator=None):
    return [(torch.randn(8, 64, generator=generator) * 5,)]


def tanh_samples(generator=None):
    return [(torch.randn(16, 16, generator=generator) * 2,)]
