"""RMSNorm as Triton kernels with a hand-written backward, the way fused norms are written.

``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2, -1) + eps)`` over
the last dimension. Each program handles a tile of
``ROWS_PER_PROGRAM`` rows. The forward kernel saves ``rstd``; the backward
kernel computes ``dx`` and sums ``dweight`` over its tile's rows into one
partial row per program, and the partial rows are summed afterwards (the
reduction across program blocks that fused-norm kernels need).

Two front ends over the same kernels:

* :class:`TritonRMSNorm`, a ``torch.autograd.Function``;
* ``torch.ops.autograd_triton.rms_norm`` (:data:`rms_norm_op`), a
  ``torch.library.custom_op`` returning ``(y, rstd)`` like aten's fused
  norms, with a fake impl and a registered backward, so opcheck and
  torch.compile apply.

Precision: float16/bfloat16/float32 inputs accumulate in float32; float64
inputs accumulate and store in float64, so gradcheck runs in float64 as it
should. ``rstd`` is float64 for float64 inputs, float32 otherwise.

Where kernels run: on CUDA tensors natively; on CPU tensors only through
Triton's interpreter, which ``TRITON_INTERPRET=1`` in the environment
switches on *before triton is imported* (this project's tests set it in
``tests/conftest.py`` when no GPU is present). A CPU tensor without the
interpreter gets a clear error instead of Triton's "0 active drivers".

The planted-bug twins (:class:`TritonRMSNormNoRstdTerm`,
:class:`TritonRMSNormLastBlockWeightGrad`) live here too, since they
share the kernels' launch code.
"""

import os
from typing import Tuple  # torch < 2.5 reads custom_op signatures from real types, not strings

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - exercised where triton is absent
    raise ImportError(
        "reference_ops.triton_ops needs triton: pip install triton (or pip install -e '.[triton]'); "
        "without a GPU it runs under TRITON_INTERPRET=1"
    ) from error

__all__ = [
    "rms_norm_triton_op",
    "rms_norm_triton_op_no_rstd_term",
    "TritonRMSNorm",
    "TritonRMSNormNoRstdTerm",
    "TritonRMSNormLastBlockWeightGrad",
    "rms_norm_op",
    "rms_norm_reference",
    "rms_norm_with_rstd_reference",
    "rms_norm_samples",
    "interpreter_on",
    "ROWS_PER_PROGRAM",
]

NAMESPACE = "autograd_triton"
ROWS_PER_PROGRAM = 4  # rows in one program's tile; test shapes use row counts it does not divide
TILE_ELEMENTS = 8192  # wide rows get fewer rows per tile, down to one, so a tile stays in registers
EPS = 1e-6

# The bugs a backward variant plants, chosen by a constexpr so the kernels are shared.
CORRECT, NO_RSTD_TERM, LAST_BLOCK_WEIGHT_GRAD = 0, 1, 2


def interpreter_on():
    """True when Triton runs kernels in its interpreter (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


@triton.jit
def _rms_norm_forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps,
                             ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    """A tile of ROWS rows per program: rstd = 1/sqrt(mean(x^2) + eps) per row, y = x * rstd * w."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(ACC)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols,
                              ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr):
    """A tile of ROWS rows per program: dx for each row, and the tile's partial sum of dweight.

    dx = rstd * (dy * w) - x * rstd^3 * mean(dy * w * x);  dweight = sum over rows of dy * x * rstd.
    """
    block = tl.program_id(0)
    rows = block * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(ACC)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC)
    rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0).to(ACC)
    dyw = dy * w[None, :]
    if BUG == 1:  # NO_RSTD_TERM: forgets that rstd depends on x
        dx = rstd[:, None] * dyw
    else:
        mean_dyw_x = tl.sum(dyw * x, axis=1) / n_cols
        dx = rstd[:, None] * dyw - x * (rstd * rstd * rstd * mean_dyw_x)[:, None]
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    dw = tl.sum(dy * x * rstd[:, None], axis=0)  # this tile's rows only: summed across tiles afterwards
    if BUG == 2:  # LAST_BLOCK_WEIGHT_GRAD: every program writes the same row, the last one wins
        tl.store(dw_partial_ptr + cols, dw, mask=col_mask)
    else:
        tl.store(dw_partial_ptr + block * n_cols + cols, dw, mask=col_mask)


# ---------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------


def _tile(n_cols):
    """(rows per program, BLOCK_N) for rows of ``n_cols`` elements."""
    block_n = triton.next_power_of_2(n_cols)
    return max(1, min(ROWS_PER_PROGRAM, TILE_ELEMENTS // block_n)), block_n


def _accumulator(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _rstd_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _require_runnable(x):
    if x.device.type == "cpu" and not interpreter_on():
        raise RuntimeError(
            "Triton kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 in the "
            "environment before triton is imported (e.g. TRITON_INTERPRET=1 pytest), or pass CUDA tensors"
        )


def _check_arguments(x, weight):
    if x.dim() < 1 or weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"rms_norm expects x of shape (..., N) and weight of shape (N,), got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"x and weight must share dtype and device, got {x.dtype}/{x.device} and "
                         f"{weight.dtype}/{weight.device}")


def _as_is(kernel):
    return kernel


def rms_norm_forward(x, weight, eps=EPS, launch=_as_is):
    """(y, rstd): y like x, rstd of shape x.shape[:-1] (float32, or float64 for float64 inputs).

    ``launch`` wraps the kernel before its launch: ``torch.library.wrap_triton`` inside a ``triton_op``."""
    _check_arguments(x, weight)
    _require_runnable(x)
    n_cols = x.shape[-1]
    rows = x.reshape(-1, n_cols).contiguous()
    y = torch.empty_like(rows)
    rstd = torch.empty(rows.shape[0], dtype=_rstd_dtype(x.dtype), device=x.device)
    if rows.numel():
        tile_rows, block_n = _tile(n_cols)
        launch(_rms_norm_forward_kernel)[(triton.cdiv(rows.shape[0], tile_rows),)](
            rows, weight.contiguous(), y, rstd, rows.shape[0], n_cols, eps,
            ROWS=tile_rows, BLOCK_N=block_n, ACC=_accumulator(x.dtype))
    return y.reshape(x.shape), rstd.reshape(x.shape[:-1])


def rms_norm_backward(grad_y, x, weight, rstd, bug=CORRECT, launch=_as_is):
    """(dx, dweight) from the saved x, weight and rstd."""
    _require_runnable(x)
    n_cols = x.shape[-1]
    rows = x.reshape(-1, n_cols).contiguous()
    dy = grad_y.reshape(-1, n_cols).contiguous()
    n_rows = rows.shape[0]
    dx = torch.empty_like(rows)
    tile_rows, block_n = _tile(n_cols)
    blocks = triton.cdiv(n_rows, tile_rows)
    dw_partial = torch.zeros(max(blocks, 1), n_cols, dtype=_rstd_dtype(x.dtype), device=x.device)
    if n_rows and n_cols:
        launch(_rms_norm_backward_kernel)[(blocks,)](
            dy, rows, weight.contiguous(), rstd.reshape(-1).contiguous(), dx, dw_partial, n_rows, n_cols,
            ROWS=tile_rows, BLOCK_N=block_n, ACC=_accumulator(x.dtype), BUG=bug)
    return dx.reshape(x.shape), dw_partial.sum(0).to(weight.dtype)


# ---------------------------------------------------------------------------
# autograd.Function front end
# ---------------------------------------------------------------------------


class TritonRMSNorm(Function):
    """``rms_norm(x, weight, eps)`` on the Triton kernels; backward is a kernel, hence once differentiable."""

    @staticmethod
    def forward(ctx, x, weight, eps=EPS):
        y, rstd = rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        return _function_backward(ctx, grad_y, CORRECT)


def _function_backward(ctx, grad_y, bug):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad_y, x, weight, rstd, bug=bug)
    return (dx if ctx.needs_input_grad[0] else None), (dw if ctx.needs_input_grad[1] else None), None


class TritonRMSNormNoRstdTerm(TritonRMSNorm):
    """Bug: dx = rstd * dy * w, missing the term from rstd's dependence on x."""

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        return _function_backward(ctx, grad_y, NO_RSTD_TERM)


class TritonRMSNormLastBlockWeightGrad(TritonRMSNorm):
    """Bug: every backward program stores its dweight partial to the same row, so only one block's rows count.

    Right whenever all rows fit in one program (``ROWS_PER_PROGRAM`` rows), wrong beyond.
    """

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        return _function_backward(ctx, grad_y, LAST_BLOCK_WEIGHT_GRAD)


# ---------------------------------------------------------------------------
# torch.library front end
# ---------------------------------------------------------------------------


def _define():
    """``autograd_triton::rms_norm`` and its backward op, once per process."""
    existing = getattr(torch.ops, NAMESPACE, None)
    if existing is not None and hasattr(existing, "rms_norm"):
        return existing.rms_norm

    @torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
    def rms_norm(x: Tensor, weight: Tensor, eps: float = EPS) -> Tuple[Tensor, Tensor]:
        return rms_norm_forward(x, weight, eps)

    @rms_norm.register_fake
    def _(x, weight, eps=EPS):
        _check_arguments(x, weight)
        return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=_rstd_dtype(x.dtype))

    @torch.library.custom_op(f"{NAMESPACE}::rms_norm_backward", mutates_args=())
    def rms_norm_backward_op(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> Tuple[Tensor, Tensor]:
        return rms_norm_backward(grad_y, x, weight, rstd)

    @rms_norm_backward_op.register_fake
    def _(grad_y, x, weight, rstd):
        return torch.empty_like(x), torch.empty_like(weight)

    rms_norm.register_autograd(_autograd_backward(rms_norm_backward_op), setup_context=_save_for_backward)
    return rms_norm


def _save_for_backward(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _autograd_backward(backward_op):
    """The registered backward of an ``(y, rstd)`` rms_norm op whose kernel backward is ``backward_op``."""

    def backward(ctx, grad_y, grad_rstd):
        x, weight, rstd = ctx.saved_tensors
        if grad_y is None:
            grad_y = torch.zeros_like(x)
        dx, dw = backward_op(grad_y, x, weight, rstd)
        if grad_rstd is not None:  # rstd is an output too: d rstd / dx = -rstd^3 * x / N
            r = rstd.unsqueeze(-1)
            dx = dx - (grad_rstd.unsqueeze(-1) * r * r * r * x / x.shape[-1]).to(dx.dtype)
        return dx, dw, None

    return backward


rms_norm_op = _define()
"""``torch.ops.autograd_triton.rms_norm(x, weight, eps) -> (y, rstd)``: a custom op over the Triton kernels."""


# ---------------------------------------------------------------------------
# torch.library.triton_op front end: what torch.compile traces into
# ---------------------------------------------------------------------------


def _define_triton_op(name, bug):
    """``autograd_triton::<name>``, a ``triton_op`` whose launches go through ``wrap_triton`` (torch >= 2.6).

    Unlike ``custom_op``, torch.compile sees the kernels themselves. Its backward is a ``triton_op`` too.
    """
    existing = getattr(getattr(torch.ops, NAMESPACE, None), name, None)
    if existing is not None:
        return existing.default
    if not hasattr(torch.library, "triton_op"):
        return None
    wrap = torch.library.wrap_triton

    @torch.library.triton_op(f"{NAMESPACE}::{name}", mutates_args=())
    def forward(x: Tensor, weight: Tensor, eps: float = EPS) -> Tuple[Tensor, Tensor]:
        return rms_norm_forward(x, weight, eps, launch=wrap)

    @torch.library.triton_op(f"{NAMESPACE}::{name}_backward", mutates_args=())
    def backward_op(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> Tuple[Tensor, Tensor]:
        return rms_norm_backward(grad_y, x, weight, rstd, bug=bug, launch=wrap)

    forward.register_autograd(_autograd_backward(backward_op), setup_context=_save_for_backward)
    return getattr(torch.ops, NAMESPACE).__getattr__(name).default


rms_norm_triton_op = _define_triton_op("rms_norm_triton", CORRECT)
"""``torch.ops.autograd_triton.rms_norm_triton``: the same kernels as a ``torch.library.triton_op`` (None on
torch < 2.6)."""
rms_norm_triton_op_no_rstd_term = _define_triton_op("rms_norm_triton_no_rstd_term", NO_RSTD_TERM)
"""Its planted-bug twin: dx misses the term from rstd's dependence on x."""


# ---------------------------------------------------------------------------
# Plain-torch references and samples
# ---------------------------------------------------------------------------


def rms_norm_with_rstd_reference(x, weight, eps=EPS):
    """(y, rstd) in plain torch, with the kernels' accumulation dtype."""
    acc = x.to(_rstd_dtype(x.dtype))
    rstd = torch.rsqrt(acc.pow(2).mean(-1) + eps)
    y = acc * rstd.unsqueeze(-1) * weight.to(acc.dtype)
    return y.to(x.dtype), rstd


def rms_norm_reference(x, weight, eps=EPS):
    """y in plain torch."""
    return rms_norm_with_rstd_reference(x, weight, eps)[0]


def rms_norm_samples(generator=None, dtype=torch.float32):
    """Row counts that ROWS_PER_PROGRAM does not divide, widths that are not powers of two (tail masks)."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype)

    # Small on purpose: gradcheck differentiates every element, and the interpreter runs each program in numpy.
    return [
        (randn(5, 3), randn(3) + 1.0),  # two programs, the second with 1 row; BLOCK_N 4 for 3 columns
        (randn(2, 3, 3), randn(3) + 1.0),  # leading batch dims: 6 rows, tiles of 4 and 2
        (randn(1, 5), randn(5) + 1.0, 1e-2),  # one row in a tile of 4, BLOCK_N 8 for 5 columns, an explicit eps
    ]
