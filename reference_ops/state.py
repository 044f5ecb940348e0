"""Ops with state: correct ones beside planted-bug twins whose state outlives a call.

Each correct op here passes every default check; each buggy twin (the
section names the check that catches it) looks plausible, passes a forward
followed at once by its own backward, and breaks only across calls:

* reentrancy: :class:`SquareSavesOnCtx` / :class:`SquareStashesInputOnClass`,
  :class:`SquareAccumulatesGradBuffer`;
* rng: :class:`NoisyScaleOwnGenerator` / :class:`NoisyScaleReseedsGlobalRng`;
* growth: :class:`WindowedScale` (a bounded cache) /
  :class:`ExpHistoryOnClass`, :class:`ExpHistoryEverySecondCall`,
  :class:`ScaleCachedByTensor`;
* aliasing: :class:`ExpSavesOutput`, :class:`RowScaleSavesReshapedView` (torch
  refuses the change through its no_grad view) / :class:`ExpKeepsDetachedOutput`,
  :class:`ScaleKeepsInputAlias`;
* mutation: :class:`ExpSavesOutput` / :class:`ExpBackwardWritesOutput`;
  :class:`PadDims` / :class:`PadDimsReversesPadsInPlace`;
  :class:`BatchNormTraining` (updates running statistics in place, declared
  with ``mutates=``).

:data:`STATE_EXAMPLES` lists the correct ops with samples and marker options.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

__all__ = [
    "BatchNormTraining",
    "ExpBackwardWritesOutput",
    "ExpHistoryOnClass",
    "ExpHistoryEverySecondCall",
    "ExpKeepsDetachedOutput",
    "ExpSavesOutput",
    "NoisyScaleOwnGenerator",
    "NoisyScaleReseedsGlobalRng",
    "PadDims",
    "PadDimsReversesPadsInPlace",
    "RowScaleSavesReshapedView",
    "ScaleCachedByTensor",
    "ScaleKeepsInputAlias",
    "SquareAccumulatesGradBuffer",
    "SquareSavesOnCtx",
    "SquareStashesInputOnClass",
    "STATE_EXAMPLES",
    "WindowedScale",
]


# ---------------------------------------------------------------------------
# reentrancy
# ---------------------------------------------------------------------------


class SquareSavesOnCtx(Function):
    """``x * x``, keeping ``x`` for backward on ctx: every call has its own."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


class SquareStashesInputOnClass(Function):
    """BUG: keeps ``x`` on the class; the next forward overwrites it before this call's backward."""

    stash = None

    @staticmethod
    def forward(ctx, x):
        SquareStashesInputOnClass.stash = x.detach()
        return x * x

    @staticmethod
    def backward(ctx, grad_output):
        return 2 * SquareStashesInputOnClass.stash * grad_output


class SquareAccumulatesGradBuffer(Function):
    """BUG: accumulates the gradient into a buffer kept per shape and never zeroed."""

    buffers = {}

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        key = (tuple(x.shape), x.dtype, x.device)
        buffer = SquareAccumulatesGradBuffer.buffers.setdefault(key, torch.zeros_like(x))
        buffer.add_(2 * x * grad_output)
        return buffer.clone()


def square_reference(x):
    return x * x


# ---------------------------------------------------------------------------
# rng
# ---------------------------------------------------------------------------


def _noise(x, generator):
    # drawn in float64 and rounded, so float32 and float64 runs of the op use the same noise
    return torch.rand(x.shape, generator=generator, dtype=torch.float64, device=x.device).to(x.dtype)


class NoisyScaleOwnGenerator(Function):
    """``x * (1 + noise / 10)`` with fixed noise drawn from a generator of its own; torch's global one is untouched."""

    @staticmethod
    def forward(ctx, x):
        generator = torch.Generator(device=x.device).manual_seed(1234)
        scale = 1 + _noise(x, generator) / 10
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad_output):
        (scale,) = ctx.saved_tensors
        return grad_output * scale


class NoisyScaleReseedsGlobalRng(Function):
    """BUG: ``torch.manual_seed(1234)`` in forward makes every random draw after the op repeat."""

    @staticmethod
    def forward(ctx, x):
        torch.manual_seed(1234)
        scale = 1 + _noise(x, None) / 10
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad_output):
        (scale,) = ctx.saved_tensors
        return grad_output * scale


# ---------------------------------------------------------------------------
# growth
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _window(n, dtype, device):
    """A Hann-like window, cached per (length, dtype, device): a bounded cache, not a leak."""
    return 0.5 - 0.5 * torch.cos(torch.linspace(0.1, 3.0, n, dtype=dtype, device=device))


class WindowedScale(Function):
    """``x * window`` along the last dimension, with the window from a bounded cache keyed by shape."""

    @staticmethod
    def forward(ctx, x):
        window = _window(x.shape[-1], x.dtype, x.device)
        ctx.save_for_backward(window)
        return x * window

    @staticmethod
    def backward(ctx, grad_output):
        (window,) = ctx.saved_tensors
        return grad_output * window


def windowed_scale_reference(x):
    return x * (0.5 - 0.5 * torch.cos(torch.linspace(0.1, 3.0, x.shape[-1], dtype=x.dtype, device=x.device)))


class ExpHistoryOnClass(Function):
    """BUG: appends every output to a list on the class ("for debugging"): one more tensor alive per call."""

    history = []

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ExpHistoryOnClass.history.append(y.detach())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * y


class ExpHistoryEverySecondCall(ExpHistoryOnClass):
    """BUG: the same list, appended to on every second call only: it grows without bound, more slowly."""

    history = []
    calls = 0

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ExpHistoryEverySecondCall.calls += 1
        if ExpHistoryEverySecondCall.calls % 2 == 0:
            ExpHistoryEverySecondCall.history.append(y.detach())
        ctx.save_for_backward(y)
        return y


@functools.lru_cache(maxsize=None)
def _doubled(x):
    return x * 2


class ScaleCachedByTensor(Function):
    """BUG: ``functools.lru_cache`` keyed by the input tensor: tensors hash by identity, so every call adds an entry."""

    @staticmethod
    def forward(ctx, x):
        return _doubled(x).clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * 2


# ---------------------------------------------------------------------------
# aliasing and mutation in backward
# ---------------------------------------------------------------------------


class ExpSavesOutput(Function):
    """``exp(x)``, saving the output with ``save_for_backward``: an in-place change to it raises."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * y


class ExpKeepsDetachedOutput(Function):
    """BUG: ``ctx.y = y.detach()`` escapes the version counter; an in-place change to ``y`` corrupts backward."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.y = y.detach()
        return y

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.y


class ExpBackwardWritesOutput(Function):
    """BUG: backward computes the gradient in the saved output's memory (``y.mul_(grad)``), overwriting the output."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return y.mul_(grad_output)


def exp_reference(x):
    return torch.exp(x)


class ScaleKeepsInputAlias(Function):
    """BUG: ``ctx.w = w.detach()``: the caller changing ``w`` in place after forward changes the gradient of ``x``."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w.detach()
        ctx.save_for_backward(x)
        return x * w

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * ctx.w, grad_output * x


class RowScaleSavesReshapedView(Function):
    """``x * w`` over rows, saving ``x.reshape(-1, n)`` as row-wise kernels do (a view made in no_grad mode).

    A caller changing ``x`` in place after forward makes torch refuse backward
    ("A view was created in no_grad mode and its base ... has been modified
    inplace"), which is as right as the version counter's error.
    """

    @staticmethod
    def forward(ctx, x, w):
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, w)
        ctx.shape = x.shape
        return (rows * w).reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        rows, w = ctx.saved_tensors
        grad_rows = grad_output.reshape(rows.shape)
        return (grad_rows * w).reshape(ctx.shape), (grad_rows * rows).sum(0)


def row_scale_reference(x, w):
    return x * w


# ---------------------------------------------------------------------------
# mutation of non-tensor arguments
# ---------------------------------------------------------------------------


def _pad_order(pads):
    """(before, after) pairs from the first padded dimension on, in F.pad's order (last dimension first)."""
    pairs = [pads[i:i + 2] for i in range(0, len(pads), 2)]
    return [value for pair in reversed(pairs) for value in pair]


def _unpad(grad, order):
    index = [slice(None)] * grad.dim()
    for k in range(len(order) // 2):
        dim = grad.dim() - 1 - k
        before, after = order[2 * k], order[2 * k + 1]
        index[dim] = slice(before, grad.shape[dim] - after)
    return grad[tuple(index)]


class PadDims(Function):
    """Zero padding of the last dimensions; ``pads`` lists (before, after) pairs from the first padded dim on."""

    @staticmethod
    def forward(ctx, x, pads):
        order = _pad_order(pads)
        ctx.order = order
        return F.pad(x, order)

    @staticmethod
    def backward(ctx, grad_output):
        return _unpad(grad_output, ctx.order), None


class PadDimsReversesPadsInPlace(Function):
    """BUG: converts ``pads`` to F.pad's order in the caller's own list, so every second call pads differently."""

    @staticmethod
    def forward(ctx, x, pads):
        pads[:] = _pad_order(pads)
        ctx.order = list(pads)
        return F.pad(x, pads)

    @staticmethod
    def backward(ctx, grad_output):
        return _unpad(grad_output, ctx.order), None


def pad_dims_reference(x, pads):
    return F.pad(x, _pad_order(pads))


# ---------------------------------------------------------------------------
# declared in-place updates (mutates=)
# ---------------------------------------------------------------------------


class BatchNormTraining(Function):
    """Batch norm in training mode over dim 0 of ``(N, C)``; updates ``running_mean`` / ``running_var`` in place.

    Like ``torch.nn.functional.batch_norm(training=True)``, the running
    statistics are buffers the op updates on purpose: declare them with
    ``mutates=("running_mean", "running_var")`` (and ``constants=`` for the
    same names, since they are not differentiated). Backward is written
    with differentiable torch ops, so double backward works.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum=0.1, eps=1e-5):
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        running_mean.mul_(1 - momentum).add_(momentum * mean)
        running_var.mul_(1 - momentum).add_(momentum * x.var(0, unbiased=True))
        ctx.eps = eps
        ctx.save_for_backward(x, weight)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        mean = x.mean(0)
        invstd = 1 / torch.sqrt(x.var(0, unbiased=False) + ctx.eps)
        xhat = (x - mean) * invstd
        grad_xhat = grad_output * weight
        grad_x = invstd * (grad_xhat - grad_xhat.mean(0) - xhat * (grad_xhat * xhat).mean(0))
        return grad_x, (grad_output * xhat).sum(0), grad_output.sum(0), None, None, None, None


def batch_norm_reference(x, weight, bias, running_mean, running_var, momentum=0.1, eps=1e-5):
    return F.batch_norm(x, running_mean.clone(), running_var.clone(), weight, bias, True, momentum, eps)


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def _randn(generator, *shape):
    return torch.randn(*shape, generator=generator)


class StateExample(NamedTuple):
    """``(function, reference, samples, options)``: a correct op, its reference, samples and marker options."""

    function: type
    reference: Callable[..., object]
    samples: Callable[..., list]
    options: dict


def _one_input(generator=None):
    return [(_randn(generator, 3, 4),), (_randn(generator, 5),)]


def _scale_samples(generator=None):
    return [(_randn(generator, 3, 4), _randn(generator, 3, 4))]


def _pad_samples(generator=None):
    return [(_randn(generator, 2, 3, 4), [1, 2, 0, 3]), (_randn(generator, 5), [2, 1])]


def _row_scale_samples(generator=None):
    return [(_randn(generator, 2, 3, 4), _randn(generator, 4)), (_randn(generator, 5, 3), _randn(generator, 3))]


def _batch_norm_samples(generator=None):
    return [(_randn(generator, 6, 3), 1 + _randn(generator, 3) / 4, _randn(generator, 3), _randn(generator, 3),
             1 + torch.rand(3, generator=generator))]


BATCH_NORM_OPTIONS = {"constants": ("running_mean", "running_var"), "mutates": ("running_mean", "running_var")}

STATE_EXAMPLES = {
    "square_saves_on_ctx": StateExample(SquareSavesOnCtx, square_reference, _one_input, {}),
    "noisy_scale_own_generator": StateExample(NoisyScaleOwnGenerator, None, _one_input, {}),
    "windowed_scale": StateExample(WindowedScale, windowed_scale_reference, _one_input, {}),
    "exp_saves_output": StateExample(ExpSavesOutput, exp_reference, _one_input, {}),
    "pad_dims": StateExample(PadDims, pad_dims_reference, _pad_samples, {}),
    "row_scale_saves_reshaped_view": StateExample(RowScaleSavesReshapedView, row_scale_reference, _row_scale_samples,
                                                  {}),
    "batch_norm_training": StateExample(BatchNormTraining, batch_norm_reference, _batch_norm_samples,
                                        BATCH_NORM_OPTIONS),
}
"""Short name -> ``StateExample(function, reference, samples, options)``: correct ops that must pass every check."""
