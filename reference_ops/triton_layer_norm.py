"""A bfloat16-only LayerNorm in Triton, the way training kernels are written, with two planted-bug twins.

``y = (x - mean) * rstd * weight + bias`` over the last dimension, for
bfloat16 tensors only: any other dtype raises a clear ``TypeError``, as a
kernel library that ships one dtype does. The forward kernel normalises a
tile of rows per program and saves ``mean`` and ``rstd`` (float32). The
backward kernel runs ``GROUPS`` programs; program ``g`` handles the row
tiles ``g, g + GROUPS, ...``: it writes each row's ``dx`` and adds the
tile's sums of ``dy * xhat`` and ``dy`` into row ``g`` of two partial
buffers, which are summed afterwards (the Triton tutorial's grouped
reduction, without its locks since each partial row has one owner).

* :class:`TritonLayerNormBf16` -- correct: computes in float32, partial
  buffers in float32, ``grad_output`` made contiguous before the kernel
  indexes it as ``row * n_cols``;
* :class:`TritonLayerNormBf16Partials` -- BUG: partial buffers allocated in
  the activations' dtype (bfloat16), so every addition rounds; over 8192 rows
  the weight and bias gradients are about 15x less accurate than the
  upcasting reference's in bfloat16 (the precision check);
* :class:`TritonLayerNormInnerStrideOnly` -- BUG: makes ``grad_output``
  contiguous only when its innermost stride is not 1. Right for contiguous
  and transposed cotangents, silently wrong for a row-strided one (what a
  backward receives when the output is concatenated or split downstream:
  ``torch.cat([y, z], -1)``) or one expanded along the rows (the
  noncontiguous check).

Under Triton's interpreter (``TRITON_INTERPRET=1``, set by this project's
tests without a GPU) the kernels run on CPU tensors. Every computation is
in float32: the interpreter loads and stores bfloat16 right (its float32 to
bfloat16 cast truncates instead of rounding to nearest, one ulp at most) but
computes wrongly *in* bfloat16.
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
        "reference_ops.triton_layer_norm needs triton: pip install triton; without a GPU it runs under "
        "TRITON_INTERPRET=1"
    ) from error

from .triton_ops import interpreter_on

__all__ = [
    "GROUPS",
    "TritonLayerNormBf16",
    "TritonLayerNormBf16Partials",
    "TritonLayerNormInnerStrideOnly",
    "layer_norm_bf16_reference",
    "layer_norm_bf16_samples",
]

GROUPS = 4  # backward programs, and partial rows of the weight and bias gradients
ROWS_PER_PROGRAM = 64  # forward tile
ROWS_PER_TILE = 16  # backward tile: 8192 rows make 128 additions to each partial row
EPS = 1e-5


@triton.jit
def _forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
                     n_rows, n_cols, GROUP_COUNT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program g: tiles g, g + GROUP_COUNT, ... of ROWS rows; dx of each row, and the tile's sums of dy * xhat
    and dy (in float32) added into partial row g."""
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    partial_offsets = group * n_cols + cols
    for tile in range(group, tl.cdiv(n_rows, ROWS), GROUP_COUNT):
        rows = tile * ROWS + tl.arange(0, ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        c1 = tl.sum(xhat * wdy, axis=1) / n_cols
        c2 = tl.sum(wdy, axis=1) / n_cols
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # Each tile's sums are added to the partial rows in their dtype: float32, or (the bug) bfloat16.
        dw = tl.load(dw_partial_ptr + partial_offsets, mask=col_mask, other=0.0).to(tl.float32)
        db = tl.load(db_partial_ptr + partial_offsets, mask=col_mask, other=0.0).to(tl.float32)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
        tl.store(dw_partial_ptr + partial_offsets, dw.to(dw_partial_ptr.dtype.element_ty), mask=col_mask)
        tl.store(db_partial_ptr + partial_offsets, db.to(db_partial_ptr.dtype.element_ty), mask=col_mask)


def _require_bfloat16(*tensors):
    for tensor in tensors:
        if tensor.dtype != torch.bfloat16:
            raise TypeError(f"layer_norm_bf16: bfloat16 tensors only, got {tensor.dtype}")


def _require_runnable(x):
    if x.device.type == "cpu" and not interpreter_on():
        raise RuntimeError(
            "Triton kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 in the "
            "environment before triton is imported (e.g. TRITON_INTERPRET=1 pytest), or pass CUDA tensors"
        )


def layer_norm_forward(x, weight, bias, eps=EPS):
    """(y, mean, rstd): y like x (its rows made contiguous), mean and rstd float32 per row."""
    _require_bfloat16(x, weight, bias)
    if weight.shape != (x.shape[-1],) or bias.shape != (x.shape[-1],):
        raise ValueError(f"layer_norm_bf16 expects x (..., N) with weight and bias (N,), got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(bias.shape)}")
    _require_runnable(x)
    n_cols = x.shape[-1]
    rows = x.reshape(-1, n_cols).contiguous()
    y = torch.empty_like(rows)
    mean = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    if rows.numel():
        _forward_kernel[(triton.cdiv(rows.shape[0], ROWS_PER_PROGRAM),)](
            rows, weight.contiguous(), bias.contiguous(), y, mean, rstd, rows.shape[0], n_cols, eps,
            ROWS=ROWS_PER_PROGRAM, BLOCK_N=triton.next_power_of_2(n_cols))
    return y.reshape(x.shape), rows, mean, rstd


def layer_norm_backward(grad_y, rows, weight, mean, rstd, partial_dtype, inner_stride_only=False):
    """(dx as rows, dweight, dbias) from the saved contiguous rows, mean and rstd."""
    _require_runnable(rows)
    n_rows, n_cols = rows.shape
    dy = grad_y.reshape(-1, n_cols)
    if inner_stride_only:
        if dy.stride(-1) != 1:  # BUG: a row stride wider than n_cols (or 0) still reaches the kernel
            dy = dy.contiguous()
    else:
        dy = dy.contiguous()
    dx = torch.empty_like(rows)
    dw_partial = torch.zeros(GROUPS, n_cols, dtype=partial_dtype, device=rows.device)
    db_partial = torch.zeros_like(dw_partial)
    if n_rows and n_cols:
        _backward_kernel[(GROUPS,)](dy, rows, weight.contiguous(), mean, rstd, dx, dw_partial, db_partial,
                                    n_rows, n_cols, GROUP_COUNT=GROUPS, ROWS=ROWS_PER_TILE,
                                    BLOCK_N=triton.next_power_of_2(n_cols))
    return dx, dw_partial.float().sum(0).to(weight.dtype), db_partial.float().sum(0).to(weight.dtype)


class TritonLayerNormBf16(Function):
    """``layer_norm(x, (N,), weight, bias, eps)`` for bfloat16 tensors, on Triton kernels."""

    partial_dtype = torch.float32
    inner_stride_only = False

    @staticmethod
    def forward(ctx, x, weight, bias, eps=EPS):
        y, rows, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(rows, weight, mean, rstd)
        ctx.shape = x.shape
        return y

    @classmethod
    @once_differentiable
    def backward(cls, ctx, grad_y):
        rows, weight, mean, rstd = ctx.saved_tensors
        partial_dtype = rows.dtype if cls.partial_dtype is None else cls.partial_dtype
        dx, dw, db = layer_norm_backward(grad_y, rows, weight, mean, rstd, partial_dtype, cls.inner_stride_only)
        return dx.reshape(ctx.shape), dw, db, None


class TritonLayerNormBf16Partials(TritonLayerNormBf16):
    """BUG: the weight and bias gradients' partial buffers are allocated in the activations' dtype (bfloat16)."""

    partial_dtype = None


class TritonLayerNormInnerStrideOnly(TritonLayerNormBf16):
    """BUG: ``grad_output`` is made contiguous only when its innermost stride is not 1."""

    inner_stride_only = True


def layer_norm_bf16_reference(x, weight, bias, eps=EPS):
    """torch's layer norm computed in float32 (float64 for float64 inputs) and rounded once, as the kernels do."""
    acc = torch.promote_types(x.dtype, torch.float32)
    return torch.nn.functional.layer_norm(x.to(acc), (x.shape[-1],), weight.to(acc), bias.to(acc), eps).to(x.dtype)


def layer_norm_bf16_samples(generator=None):
    """bfloat16 activations and parameters; rows not a multiple of the tiles, widths not powers of two."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    bf16 = torch.bfloat16
    return [(randn(6, 12).to(bf16), (1 + 0.1 * randn(12)).to(bf16), (0.1 * randn(12)).to(bf16)),
            (randn(2, 3, 10).to(bf16), (1 + 0.1 * randn(10)).to(bf16), (0.1 * randn(10)).to(bf16))]
