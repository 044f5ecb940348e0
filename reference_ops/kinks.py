"""Correct ops evaluated exactly at their kinks: integer-valued samples on a clamp's bounds, max with ties,
abs at 0, a norm at zero.

At such points the left and right derivatives differ and central
differences average them; each backward here returns a valid one-sided
value or a subgradient, as torch's own kernels do. Every default check must
pass on them (kinks are noted, not failed). Their planted-bug twins live in
:mod:`reference_ops.buggy_kinks`.
"""

import torch
from torch.autograd import Function


class ClampFunction(Function):
    """``x.clamp(low, high)``; the gradient passes where ``low <= x <= high`` (bounds included, like torch)."""

    @staticmethod
    def forward(ctx, x, low, high):
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ((x >= ctx.low) & (x <= ctx.high)).to(grad.dtype), None, None


class MaxWithTies(Function):
    """``x.amax(dim)``; the gradient is shared evenly among tied maxima, like ``torch.amax``."""

    @staticmethod
    def forward(ctx, x, dim):
        out = x.amax(dim, keepdim=True)
        mask = (x == out).to(x.dtype)
        ctx.save_for_backward(mask / mask.sum(dim, keepdim=True))
        ctx.dim = dim
        return out.squeeze(dim)

    @staticmethod
    def backward(ctx, grad):
        (share,) = ctx.saved_tensors
        return grad.unsqueeze(ctx.dim) * share, None


class AbsFunction(Function):
    """``x.abs()``; the gradient at 0 is ``sign(0) = 0``, a subgradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.abs()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.sign()


class RowNorm(Function):
    """Euclidean norm of each row; the gradient of a zero row is 0 (a subgradient), not NaN."""

    @staticmethod
    def forward(ctx, x):
        norm = x.norm(dim=-1)
        ctx.save_for_backward(x, norm)
        return norm

    @staticmethod
    def backward(ctx, grad):
        x, norm = ctx.saved_tensors
        safe = torch.where(norm == 0, torch.ones_like(norm), norm)
        direction = torch.where((norm == 0).unsqueeze(-1), torch.zeros_like(x), x / safe.unsqueeze(-1))
        return grad.unsqueeze(-1) * direction


def integer_valued(*shape, low=-3, high=4, generator=None, dtype=torch.float32):
    """Quantised samples: small integers, so clamp bounds and ties are hit exactly."""
    return torch.randint(low, high, shape, generator=generator).to(dtype)


def clamp_samples(generator=None, dtype=torch.float32):
    bounds_hit = torch.tensor([[-1.0, 2.0, 0.0, -3.0, 3.0]], dtype=dtype)  # on both bounds, inside, outside
    return [(torch.cat([bounds_hit, integer_valued(3, 5, generator=generator, dtype=dtype)]), -1.0, 2.0)]


def max_with_ties_samples(generator=None, dtype=torch.float32):
    x = torch.tensor([[3.0, 1.0, 3.0, -2.0], [0.0, 0.0, 0.0, -1.0], [2.0, 5.0, 1.0, 5.0]], dtype=dtype)
    return [(x, 1)]


def abs_samples(generator=None, dtype=torch.float32):
    zeros_hit = torch.tensor([[0.0, -1.0, 0.0, 2.0]], dtype=dtype)
    return [(torch.cat([zeros_hit, integer_valued(2, 4, low=-1, high=2, generator=generator, dtype=dtype)]),)]


def row_norm_samples(generator=None, dtype=torch.float32):
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, -4.0, 1.0]], dtype=dtype)
    return [(x,)]


__all__ = ["ClampFunction", "MaxWithTies", "AbsFunction", "RowNorm", "clamp_samples", "max_with_ties_samples",
           "abs_samples", "row_norm_samples", "integer_valued"]
