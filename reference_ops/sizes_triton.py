"""A Triton kernel whose backward grid forgets the last program, and its correct twin.

``scale_columns(x, weight) = x * weight`` over the last dim, one 1-D launch
over the flattened elements in blocks of ``BLOCK``: the same kernel computes
``y = x * weight`` forward and ``dx = dy * weight`` backward; ``dweight`` is a
torch sum. :class:`TritonScaleColumnsGridFloor` launches its backward with
``n // BLOCK`` programs instead of ``triton.cdiv(n, BLOCK)``: right whenever
``BLOCK`` divides the element count (the power-of-two sample in
:data:`SAMPLES`), and the last elements get no gradient otherwise.

Runs on CUDA tensors natively, on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1`` before triton is imported; see
:mod:`reference_ops.triton_ops`).
"""

from __future__ import annotations

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised where triton is absent
    raise ImportError(
        "reference_ops.sizes_triton needs triton: pip install triton (or pip install -e '.[test]'); "
        "without a GPU it runs under TRITON_INTERPRET=1"
    ) from error

from .triton_ops import _require_runnable

__all__ = ["BLOCK", "TritonScaleColumns", "TritonScaleColumnsGridFloor", "scale_columns_reference", "SAMPLES"]

BLOCK = 128  # elements per program


@triton.jit
def _scale_columns_kernel(x_ptr, w_ptr, y_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
    """y = x * w[column] for one block of the flattened elements."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    w = tl.load(w_ptr + offsets % n_cols, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, x * w, mask=mask)


def _scale(x, weight, grid_floor=False):
    _require_runnable(x)
    x = x.contiguous()
    y = torch.zeros_like(x)
    n = x.numel()
    if n:
        programs = n // BLOCK if grid_floor else triton.cdiv(n, BLOCK)  # BUG when floored: the tail is left out
        if programs:
            _scale_columns_kernel[(programs,)](x, weight.contiguous(), y, n, x.shape[-1], BLOCK=BLOCK)
    return y


class TritonScaleColumns(Function):
    """``x * weight`` over the last dim by one Triton kernel, forward and backward."""

    grid_floor = False

    @staticmethod
    def forward(ctx, x, weight):
        if x.dim() < 1 or weight.shape != x.shape[-1:]:
            raise ValueError(f"scale_columns expects x (..., N) and weight (N,), got {tuple(x.shape)} and "
                             f"{tuple(weight.shape)}")
        ctx.save_for_backward(x, weight)
        return _scale(x, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        floored = getattr(ctx, "_forward_cls", TritonScaleColumns).grid_floor
        grad_x = _scale(grad, weight, grid_floor=floored)
        grad_weight = (grad * x).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_weight


class TritonScaleColumnsGridFloor(TritonScaleColumns):
    """Bug: backward launches ``n // BLOCK`` programs, so elements past the last full block get no gradient."""

    grid_floor = True


def scale_columns_reference(x, weight):
    return x * weight


SAMPLES = lambda generator=None: [  # noqa: E731 - 256 elements: two full blocks
    (torch.randn(8, 32, generator=generator), torch.randn(32, generator=generator)),
]
"""``SAMPLES(generator)``: argument tuples at a power-of-two size that BLOCK divides."""
