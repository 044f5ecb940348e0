"""Ops that also return statistics for a later kernel, declared non-differentiable, with a planted twin.

Fused normalisation kernels return ``rstd`` (or mean and variance) next to
their output so that a backward kernel or the next layer can reuse them,
and mark them with ``ctx.mark_non_differentiable``. The derivative checks
judge the differentiable output only; a wrong gradient of it still fails.
"""

import torch
from torch.autograd import Function

__all__ = ["RMSNormWithRstd", "RMSNormWithRstdWeightGradWrong", "rms_norm_with_rstd_reference",
           "rms_norm_with_rstd_samples"]

EPS = 1e-6


def _rstd(x):
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class RMSNormWithRstd(Function):
    """``(x * rstd * w, rstd)``; ``rstd`` is marked non-differentiable, backward recomputes it from ``x`` so
    that its own gradient exists."""

    @staticmethod
    def forward(ctx, x, w):
        rstd = _rstd(x)
        ctx.save_for_backward(x, w)
        ctx.mark_non_differentiable(rstd)
        return x * rstd * w, rstd

    @staticmethod
    def backward(ctx, grad, grad_rstd):
        x, w = ctx.saved_tensors
        rstd = _rstd(x)
        normed = x * rstd
        grad_normed = grad * w
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        grad_w = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_w


class RMSNormWithRstdWeightGradWrong(RMSNormWithRstd):
    """BUG: the weight's gradient forgets the normalised input (sums ``grad`` alone)."""

    @staticmethod
    def backward(ctx, grad, grad_rstd):
        grad_x, _ = RMSNormWithRstd.backward(ctx, grad, grad_rstd)
        return grad_x, grad.reshape(-1, grad.shape[-1]).sum(0)


def rms_norm_with_rstd_reference(x, w):
    rstd = _rstd(x)
    return x * rstd * w, rstd.detach()


def rms_norm_with_rstd_samples(generator=None):
    return [(torch.randn(4, 8, generator=generator), torch.randn(8, generator=generator)),
            (torch.randn(2, 3, 16, generator=generator), torch.randn(16, generator=generator))]
