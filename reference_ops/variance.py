"""A precise op checked against a less precise reference, and its wrong twin.

:class:`TwoPassVariance` computes the population variance along the last
dimension in two passes (mean, then mean squared deviation): right to a few
ulps in float32. The textbook reference ``E[x^2] - E[x]^2`` cancels
catastrophically when the mean is large against the spread, off by 1e-2 in
float32 for data around 1000. Judged against float64 on the same rounded
inputs, the reference is the imprecise one, and the op must not be blamed.
:class:`TwoPassVarianceHalfGradient` forgets the factor 2 of ``d/dx`` and
must fail against any reference.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "TwoPassVariance",
    "TwoPassVarianceHalfGradient",
    "textbook_variance_reference",
    "variance_samples",
]


class TwoPassVariance(Function):
    """``mean((x - mean(x))^2)`` over the last dimension, in two passes."""

    factor = 2.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        centred = x - x.mean(-1, keepdim=True)
        return (centred * centred).mean(-1)

    @classmethod
    def backward(cls, ctx, grad):
        (x,) = ctx.saved_tensors
        centred = x - x.mean(-1, keepdim=True)  # recomputed from the input, so backward is differentiable
        return grad.unsqueeze(-1) * cls.factor * centred / x.shape[-1]


class TwoPassVarianceHalfGradient(TwoPassVariance):
    """BUG: ``d/dx`` of ``mean(c^2)`` is ``2 c / n``; the factor 2 is missing."""

    factor = 1.0


def textbook_variance_reference(x):
    """``E[x^2] - E[x]^2``: exact maths, catastrophic cancellation in float32 when the mean is large."""
    return (x * x).mean(-1) - x.mean(-1) ** 2


def variance_samples(generator=None, dtype=torch.float32):
    """Rows around 1000 with a spread of one: the textbook formula loses most of its digits in float32."""
    return [(1000 + torch.randn(4, 32, generator=generator, dtype=dtype),)]
