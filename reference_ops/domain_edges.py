"""Ops whose domain ends near their samples: ``sqrt`` and ``log`` of ``torch.rand`` values, with wrong twins.

``torch.rand`` draws elements arbitrarily close to 0: a 256k-element sample
holds, one time in three, an element nearer 0 than gradcheck's float64 step
(1e-6 along a direction of magnitudes 1 to 2), and every float32 sample one
nearer than the float32 step (0.005 of the largest element). Moved by the
step, ``sqrt`` and ``log`` of that element are NaN while the op is right.
The derivative checks measure such elements at finer steps inside the
domain, and leave out (naming them) the few that no step reaches; before,
a correct op failed ("expected nan (numerical)"), and on a small sample
one such element hid every other element's error, so a wrong op passed.

* :class:`Sqrt` -- ``sqrt``, saving its output (any floating dtype);
* :class:`Float32Sqrt` -- ``sqrt`` computed in float32 whatever the input
  dtype (a kernel's ``.float()`` load), judged by float32 differences;
* :class:`SqrtTenPercentOff`, :class:`Float32SqrtTenPercentOff` -- BUG: the
  gradient 10% too small everywhere;
* :class:`SqrtWrongNearZero` -- BUG: the gradient of the element nearest 0
  of each sample halved (an edge case of a kernel's small-value branch).

:func:`near_zero_samples` gives a 128 x 256 sample with elements at 1e-7
and 3e-9 (within the float64 step) and at 1e-13 (within the finest step the
checks try), and a 30-element sample (judged by the full Jacobian) with one
at 1e-7.

:class:`Float32Log` (``log`` in float32) meets a pole instead: its backward
``grad / x`` stays finite across 0, so gradgradcheck's float32 steps crossed
the pole of an element nearer 0 than the step with nothing non-finite to say
so, and failed the correct op (one 512 x 512 draw in five). A random
direction whose failure one element dominates is judged again as that
element alone (at a step of its own magnitude's scale) and the rest.
:class:`Float32LogTenPercentOff` -- BUG: its gradient 10% too small.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "Sqrt",
    "SqrtTenPercentOff",
    "SqrtWrongNearZero",
    "Float32Sqrt",
    "Float32SqrtTenPercentOff",
    "Float32Log",
    "Float32LogTenPercentOff",
    "near_zero_samples",
]


class Sqrt(Function):
    """``sqrt(x)``; backward ``grad / (2 sqrt(x))`` from the saved output."""

    @staticmethod
    def forward(ctx, x):
        y = x.sqrt()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad / (2 * y)


class SqrtTenPercentOff(Sqrt):
    """BUG: the gradient 10% too small everywhere."""

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad / (2.2 * y)


class SqrtWrongNearZero(Sqrt):
    """BUG: the gradient of each sample's element nearest 0 halved."""

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        out = grad / (2 * y)
        flat = out.reshape(-1).clone()
        flat[y.reshape(-1).argmin()] *= 0.5
        return flat.view_as(out)


class Float32Sqrt(Function):
    """``sqrt(x)`` computed in float32 whatever the input dtype; backward likewise, from the saved output."""

    @staticmethod
    def forward(ctx, x):
        y = x.float().sqrt()
        ctx.save_for_backward(y)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return (grad.float() / (2 * y)).to(grad.dtype)


class Float32SqrtTenPercentOff(Float32Sqrt):
    """BUG: the gradient 10% too small everywhere."""

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return (grad.float() / (2.2 * y)).to(grad.dtype)


class Float32Log(Function):
    """``log(x)`` computed in float32 whatever the input dtype; backward ``grad / x`` likewise."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.float().log().to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad.float() / x.float()).to(grad.dtype)


class Float32LogTenPercentOff(Float32Log):
    """BUG: the gradient 10% too small everywhere."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad.float() / (1.1 * x.float())).to(grad.dtype)


def near_zero_samples(generator=None, dtype=torch.float64):
    """A 128 x 256 ``torch.rand`` sample with elements at 1e-7, 3e-9 and 1e-13, and a 30-element one with an
    element at 1e-7."""
    large = torch.rand(128, 256, generator=generator, dtype=dtype)
    large[3, 4], large[100, 7], large[127, 0] = 1e-7, 3e-9, 1e-13
    small = torch.rand(30, generator=generator, dtype=dtype)
    small[3] = 1e-7
    return [(large,), (small,)]
