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
* :class:`GeluSavesCdf`: GELU whose forward saves the intermediate
  ``Phi(x)`` and whose backward uses it: right first derivative, but double
  backward sees ``Phi(x)`` as a constant (it has no graph) and misses its
  term. Twin: :class:`Gelu`, which recomputes it in backward.
* :class:`TanhSavesSlope`: the same bug where backward uses nothing else
  (``grad * (1 - y^2)`` with ``1 - y^2`` saved): the second derivative is
  all zeros. Twin: :class:`TanhSavesOutput`, which saves the output.
* :class:`CubeHalfSecondDerivativeSavesUnused`: a wrong second derivative
  (``3 x x.detach()``) of an op that also saves an intermediate it never
  uses: that intermediate explains nothing, and the report must not blame it.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from reference_ops.edges import Tanh

__all__ = [
    "Square",
    "SquareSqrtOfSavedOutput",
    "SquareNoDoubleBackward",
    "CubeCachesInput",
    "Gelu",
    "GeluSavesCdf",
    "TanhSavesOutput",
    "TanhSavesSlope",
    "CubeHalfSecondDerivativeSavesUnused",
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


def _normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / 2 ** 0.5))


def _normal_pdf(x):
    return torch.exp(-x * x / 2) / (2 * torch.pi) ** 0.5


class Gelu(Function):
    """``x Phi(x)``; backward recomputes ``Phi(x)`` from the saved input, so it is differentiable again."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * _normal_cdf(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (_normal_cdf(x) + x * _normal_pdf(x))


class GeluSavesCdf(Function):
    """BUG: saves the intermediate ``Phi(x)`` computed in forward; double backward treats it as a constant."""

    @staticmethod
    def forward(ctx, x):
        cdf = _normal_cdf(x)
        ctx.save_for_backward(x, cdf)
        return x * cdf

    @staticmethod
    def backward(ctx, grad):
        x, cdf = ctx.saved_tensors
        return grad * (cdf + x * _normal_pdf(x))


class TanhSavesOutput(Tanh):
    """``tanh``; saves its output, which keeps its graph, so ``grad * (1 - y^2)`` is differentiable again."""


class TanhSavesSlope(Function):
    """BUG: saves the intermediate slope ``1 - y^2``: double backward sees a constant, every second derivative is 0."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(1 - y * y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (slope,) = ctx.saved_tensors
        return grad * slope


class CubeHalfSecondDerivativeSavesUnused(Function):
    """BUG: ``3 x x.detach()`` halves the second derivative; the saved ``2 x`` is never used."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x, 2 * x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        x, _ = ctx.saved_tensors
        return grad * 3 * x * x.detach()


def square_samples(generator=None, dtype=torch.float32):
    """Values with an exact zero, where sqrt of the saved output has an infinite derivative."""
    x = torch.randn(2, 3, generator=generator, dtype=dtype)
    x[0, 1] = 0.0
    return [(x,)]
