"""Ops whose failure has a known shape, which the report must name, with their correct twins.

* :class:`SquareSqrtOfSavedOutput`: ``x^2`` whose backward writes ``2x`` as
  ``2 sign(x) sqrt(y)`` of the saved output ``y``: right first derivative,
  NaN second derivative where ``x = 0`` (d sqrt(y)/dy is inf there).
  Twin: :class:`Square`.
* :class:`SquareNoDoubleBackward`: ``x^2`` whose backward runs a kernel that
  refuses to be differentiated, as torchvision's roi ops and ``ctc_loss``
  do. Correct once the marker says ``double_backward=False``.
* :class:`CubeCachesInput`: saves ``x`` with ``ctx.save_for_backward`` (as it
  should) but also appends it to a module-level cache, which keeps it alive.
  Twin: :class:`reference_ops.Cube`.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "Square",
    "SquareSqrtOfSavedOutput",
    "SquareNoDoubleBackward",
    "CubeCachesInput",
    "square_samples",
]


class Square(Function):
    """``x^2``, backward ``2 x grad`` from the saved input: differentiable twice everywhere."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class SquareSqrtOfSavedOutput(Function):
    """BUG: backward recovers ``|x|`` as ``sqrt(y)`` of the saved output: its derivative is NaN at ``x = 0``."""

    @staticmethod
    def forward(ctx, x):
        y = x * x
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return 2 * torch.sign(x).detach() * torch.sqrt(y) * grad


class _KernelWithoutDoubleBackward(Function):
    """``2 x grad`` computed by a 'kernel' whose own backward is not implemented."""

    @staticmethod
    def forward(ctx, x, grad):
        return 2 * x * grad

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("double backwards on square not supported")


class SquareNoDoubleBackward(Function):
    """``x^2`` whose backward calls a kernel without a derivative: declare ``double_backward=False``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _KernelWithoutDoubleBackward.apply(x, grad)


CACHE = []


class CubeCachesInput(Function):
    """BUG: ``x^3`` that saves ``x`` correctly but also keeps it in a module-level cache."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        CACHE.append(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


def square_samples(generator=None, dtype=torch.float32):
    """Values with an exact zero, where sqrt of the saved output has an infinite derivative."""
    x = torch.randn(2, 3, generator=generator, dtype=dtype)
    x[0, 1] = 0.0
    return [(x,)]
