"""Planted-bug twins of :mod:`reference_ops.kinks`: wrong where the answer is not a matter of kinks.

* :class:`ClampGradientLeaksBelow` -- the gradient also passes below the lower
  bound, where the clamp is flat: wrong away from any kink.
* :class:`MaxTiesFullGradient` -- every tied maximum gets the full gradient,
  so the gradients of k ties add up to k times the derivative.
"""

from torch.autograd import Function


class ClampGradientLeaksBelow(Function):
    """BUG: mask ``x <= high`` forgets the lower bound, so flat elements below it get gradient 1."""

    @staticmethod
    def forward(ctx, x, low, high):
        ctx.save_for_backward(x)
        ctx.high = high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x <= ctx.high).to(grad.dtype), None, None


class MaxTiesFullGradient(Function):
    """BUG: ``grad * (x == max)`` gives every tied maximum the full gradient instead of a share."""

    @staticmethod
    def forward(ctx, x, dim):
        out = x.amax(dim, keepdim=True)
        ctx.save_for_backward((x == out).to(x.dtype))
        ctx.dim = dim
        return out.squeeze(dim)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad.unsqueeze(ctx.dim) * mask, None


__all__ = ["ClampGradientLeaksBelow", "MaxTiesFullGradient"]
