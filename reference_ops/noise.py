"""Ops that draw noise from torch's global random generator on every call, as training steps do.

Finite differences see the derivative of such an op only when every
evaluation draws the same numbers: the derivative checks start the generator
from one seed before each evaluation, so these correct ops pass, and a
backward that draws the noise again instead of using forward's fails.

* :class:`GaussianNoise` -- correct; ``x + sigma * eps`` (noise injection).
* :class:`MultiplicativeNoise` -- correct; ``x * (1 + sigma * eps)``, ``eps`` saved for backward.
* :class:`Reparameterized` -- correct; a reparameterized sample ``mu + exp(log_sigma) * eps``.
* :class:`GumbelSoftmax` -- correct; ``softmax((logits + g) / tau)`` with Gumbel noise ``g``.
* :class:`MultiplicativeNoiseRedrawsInBackward` -- backward draws ``eps`` again (gradcheck catches it).
* :class:`ReparameterizedRedrawsInBackward` -- backward draws ``eps`` again for ``log_sigma``'s gradient.

Two runs of such an op differ by design: the determinism check judges it
with torch's generator reseeded before each run, and notes it.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "GaussianNoise",
    "GumbelSoftmax",
    "MultiplicativeNoise",
    "MultiplicativeNoiseRedrawsInBackward",
    "Reparameterized",
    "ReparameterizedRedrawsInBackward",
    "gumbel_samples",
    "noise_samples",
    "reparameterized_samples",
]

SIGMA = 0.1


class GaussianNoise(Function):
    """``x + SIGMA * eps``, ``eps`` standard normal: the gradient is the identity, whatever was drawn."""

    @staticmethod
    def forward(ctx, x):
        return x + SIGMA * torch.randn_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class MultiplicativeNoise(Function):
    """``x * (1 + SIGMA * eps)``: backward scales by the very noise forward drew, saved on ctx."""

    @staticmethod
    def forward(ctx, x):
        scale = 1 + SIGMA * torch.randn_like(x)
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale


class MultiplicativeNoiseRedrawsInBackward(Function):
    """Bug: backward draws the noise again (``torch.randn_like``), so it scales by other numbers than forward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * (1 + SIGMA * torch.randn_like(x))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 + SIGMA * torch.randn_like(x))


class Reparameterized(Function):
    """``mu + exp(log_sigma) * eps``: a variational layer's sample, differentiable in both parameters."""

    @staticmethod
    def forward(ctx, mu, log_sigma):
        eps = torch.randn_like(mu)
        ctx.save_for_backward(eps, log_sigma)
        return mu + log_sigma.exp() * eps

    @staticmethod
    def backward(ctx, grad):
        eps, log_sigma = ctx.saved_tensors
        return grad, grad * eps * log_sigma.exp()


class ReparameterizedRedrawsInBackward(Reparameterized):
    """Bug: backward draws ``eps`` again for ``log_sigma``'s gradient instead of using forward's."""

    @staticmethod
    def backward(ctx, grad):
        _, log_sigma = ctx.saved_tensors
        return grad, grad * torch.randn_like(log_sigma) * log_sigma.exp()


class GumbelSoftmax(Function):
    """``softmax((logits + g) / tau, -1)``, ``g = -log(-log(u))`` with ``u`` uniform: backward from the output."""

    @staticmethod
    def forward(ctx, logits, tau):
        u = torch.rand_like(logits).clamp(1e-10, 1 - 1e-10)
        y = torch.softmax((logits - torch.log(-torch.log(u))) / tau, -1)
        ctx.tau = tau
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True)) / ctx.tau, None


def noise_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator),)]


def reparameterized_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator), 0.3 * torch.randn(6, 8, generator=generator))]


def gumbel_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator), 0.7)]
