"""Ops written the way fused training kernels are (Liger, Apex, hand-written Triton/CUDA).

Two habits set them apart from the tutorial Functions:

* they compute in float32 whatever dtype they are given (``x.float()`` ...
  ``.to(x.dtype)``), so on float64 inputs they return float64 tensors
  holding float32 numbers;
* their backward is a kernel: it returns gradients with no graph behind
  them, and nobody declared ``@once_differentiable``.

Inside a model that runs in float32 or bfloat16 both are how the op is meant
to work; the model scan judges such ops in float32 and does not ask for a
second derivative (see docs/model_scan.md). :class:`FusedRMSNormNoRstdTerm`
is the planted-bug twin: its ``dx`` forgets that ``rstd`` depends on ``x``.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = ["FusedRMSNorm", "FusedRMSNormNoRstdTerm", "FusedSwiGLU", "FusedBlock"]


class FusedRMSNorm(Function):
    """``x * rstd * weight`` over the last dimension, in float32, with a kernel-style backward."""

    @staticmethod
    def forward(ctx, x, weight, eps=1e-6):
        wide = x.float()
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (wide * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.no_grad():  # what a kernel gives: values, no graph
            x, weight, rstd = ctx.saved_tensors
            normed = x.float() * rstd
            scaled = grad.float() * weight.float()
            dx = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
            dweight = (grad.float() * normed).reshape(-1, x.shape[-1]).sum(0)
            return dx.to(x.dtype), dweight.to(weight.dtype), None


class FusedRMSNormNoRstdTerm(FusedRMSNorm):
    """Bug: ``dx = rstd * grad * weight``, missing the term from ``rstd``'s dependence on ``x``."""

    @staticmethod
    def backward(ctx, grad):
        with torch.no_grad():
            x, weight, rstd = ctx.saved_tensors
            normed = x.float() * rstd
            dx = rstd * grad.float() * weight.float()
            dweight = (grad.float() * normed).reshape(-1, x.shape[-1]).sum(0)
            return dx.to(x.dtype), dweight.to(weight.dtype), None


class FusedSwiGLU(Function):
    """``silu(gate) * up`` in float32, with a kernel-style backward."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.no_grad():
            gate, up = ctx.saved_tensors
            sigmoid = torch.sigmoid(gate.float())
            silu = gate.float() * sigmoid
            dgate = grad.float() * up.float() * (sigmoid + silu * (1 - sigmoid))
            return dgate.to(gate.dtype), (grad.float() * silu).to(up.dtype)


class FusedBlock(torch.nn.Module):
    """``x + down(swiglu(gate(norm(x)), up(norm(x))))`` on the fused ops; ``norm=`` picks the norm Function."""

    def __init__(self, hidden=8, inner=12, norm=FusedRMSNorm):
        super().__init__()
        self.norm_weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.gate = torch.nn.Linear(hidden, inner, bias=False)
        self.up = torch.nn.Linear(hidden, inner, bias=False)
        self.down = torch.nn.Linear(inner, hidden, bias=False)
        self.norm = norm

    def forward(self, x):
        normed = self.norm.apply(x, self.norm_weight)
        return x + self.down(FusedSwiGLU.apply(self.gate(normed), self.up(normed)))
