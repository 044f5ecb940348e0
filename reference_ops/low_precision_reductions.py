"""A layer norm whose weight and bias gradients are summed in partial buffers, correct and with a planted bug.

Fused norm kernels reduce ``dweight = sum over rows of dy * xhat`` (and
``dbias``) in two stages: each of ``GROUPS`` partial rows accumulates every
``GROUPS``-th row, then the partial rows are summed (the Triton tutorial's
grouped reduction). The partial buffers' dtype is the whole difference:

* :class:`LayerNormFloat32Partials` -- partials in float32 (float64 for
  float64 inputs), rounded to the inputs' dtype once at the end; about as
  accurate as ``torch.nn.functional.layer_norm`` in bfloat16;
* :class:`LayerNormInputDtypePartials` -- BUG: partials allocated in the
  activations' dtype, so in bfloat16 every one of the ``rows / GROUPS``
  additions rounds to 8 bits of mantissa. Over 8192 rows the weight
  gradient is about 15x less accurate than the reference's in bfloat16,
  while in float32 and float64 the two are indistinguishable, and a test
  sample of a few rows hides it too (one addition per partial).

Forward and ``dx`` compute in float32 (float64 for float64 inputs) and round
once. Written in torch, so they run in every dtype on every device; the
Triton versions are in :mod:`reference_ops.triton_layer_norm`.
"""

from __future__ import annotations

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

__all__ = [
    "GROUPS",
    "LayerNormFloat32Partials",
    "LayerNormInputDtypePartials",
    "layer_norm_reference",
    "layer_norm_samples",
]

GROUPS = 32  # partial rows of the two-stage reduction
EPS = 1e-5


def _accumulator(dtype):
    return torch.promote_types(dtype, torch.float32)


def grouped_row_sum(terms, partial_dtype):
    """Sum ``terms`` (rows, n) over rows in two stages: GROUPS partial rows in ``partial_dtype``, then float32."""
    partial = torch.zeros(GROUPS, terms.shape[-1], dtype=partial_dtype, device=terms.device)
    for start in range(0, terms.shape[0], GROUPS):
        chunk = terms[start:start + GROUPS]
        partial[:chunk.shape[0]] += chunk  # computed in the wider dtype, stored (rounded) in partial_dtype
    return partial.to(_accumulator(terms.dtype)).sum(0)


class LayerNormFloat32Partials(Function):
    """``layer_norm(x, (n,), weight, bias, eps)``; weight and bias gradients summed in float32 partial rows."""

    @staticmethod
    def partial_dtype(x):
        return _accumulator(x.dtype)

    @staticmethod
    def forward(ctx, x, weight, bias, eps=EPS):
        acc = _accumulator(x.dtype)
        rows = x.reshape(-1, x.shape[-1]).to(acc)
        mean = rows.mean(-1, keepdim=True)
        rstd = torch.rsqrt((rows - mean).pow(2).mean(-1, keepdim=True) + eps)
        xhat = (rows - mean) * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.shape = x.shape
        return (xhat * weight.to(acc) + bias.to(acc)).to(x.dtype).reshape(x.shape)

    @classmethod
    @once_differentiable
    def backward(cls, ctx, grad):
        xhat, rstd, weight = ctx.saved_tensors
        dy = grad.reshape(xhat.shape).to(xhat.dtype)
        wdy = dy * weight.to(xhat.dtype)
        dx = rstd * (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True) - wdy.mean(-1, keepdim=True))
        partial = cls.partial_dtype(grad)
        dweight = grouped_row_sum(dy * xhat, partial).to(weight.dtype)
        dbias = grouped_row_sum(dy, partial).to(weight.dtype)
        return dx.to(grad.dtype).reshape(ctx.shape), dweight, dbias, None


class LayerNormInputDtypePartials(LayerNormFloat32Partials):
    """BUG: the partial rows of the weight and bias gradients are allocated in the activations' dtype."""

    @staticmethod
    def partial_dtype(x):
        return x.dtype


def layer_norm_reference(x, weight, bias, eps=EPS):
    """torch's layer norm computed in float32 (float64 for float64 inputs) and rounded once, as kernels do.

    ``torch.nn.functional.layer_norm`` itself, in bfloat16 on the CPU, sums
    the weight gradient in bfloat16: over 8192 rows it is less accurate than
    the buggy op here, so it would hide the bug (and pass it, rightly, as
    no worse than its reference).
    """
    acc = _accumulator(x.dtype)
    return torch.nn.functional.layer_norm(x.to(acc), (x.shape[-1],), weight.to(acc), bias.to(acc), eps).to(x.dtype)


def layer_norm_samples(generator=None, dtype=torch.bfloat16):
    """A few rows of bfloat16 activations, weight near 1: a bfloat16 training step's shapes, made small."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return [(randn(8, 24).to(dtype), (1 + 0.1 * randn(24)).to(dtype), (0.1 * randn(24)).to(dtype)),
            (randn(2, 3, 16).to(dtype), (1 + 0.1 * randn(16)).to(dtype), (0.1 * randn(16)).to(dtype))]
