"""Tiled kernels written in torch, right at power-of-two sizes and wrong at others, with correct twins.

Each op imitates how a GPU kernel is written: blocks of ``BLOCK`` columns
with a mask for the last, partial block, programs of ``ROWS`` rows, a
reduction split into chunks of ``SPLIT``. Every buggy twin passes every
other check at its power-of-two sample (:data:`SAMPLES`) and is wrong only at
sizes that sample does not have, which is what the ``sizes`` check is for:

* :class:`TiledSoftmaxTailReadsNextRow` -- the last block is loaded without
  its mask, so a row whose width is not a multiple of ``BLOCK`` reads the
  next row's first elements into its max and sum;
* :class:`TiledSoftmaxGridFloor` -- backward launches ``rows // ROWS``
  programs instead of ``cdiv(rows, ROWS)``: the last, partial program is
  missing and its rows get no gradient;
* :class:`SplitKMatmulInclusiveEnd` -- each split's end is inclusive, so the
  element at a boundary between splits is counted twice (right while the
  reduction fits one split);
* :class:`BatchCenteredSqueeze` -- ``x.squeeze()`` to accept ``(B, 1, N)``
  inputs also squeezes a batch of one, and the mean over the batch becomes a
  mean over the features. Forward and backward share the mistake, so they
  agree with each other: only ``reference=`` shows it.

* :class:`OnlineSoftmaxNoRescale` -- a flash-style softmax streaming over
  blocks of ``STREAM_BLOCK`` columns forgets to rescale its running sum when
  a later block raises the running max;
* :class:`BlockRowMaxNoOffset` -- a row max reduced block by block sends the
  gradient to the position of the max *within* its block, forgetting the
  block's offset.

  Both are right while a row fits one block, and right whenever a row's
  largest value lies in its first block: the sizes check's wider variants
  keep the sample's own values exact in the last whole copy, past the first
  block.

* :class:`RowNormalizeBackwardSumsDimOne` -- a row L2 normalization whose
  backward reduces over dim 1 where the forward reduces over the last dim:
  the same dim for the ``(rows, features)`` sample, another for a 3-D
  activation;
* :class:`TiledSoftmaxRowsFromDimZero` -- forward and backward view the
  input as ``(x.shape[0], -1)`` rows: for a 3-D activation a row becomes
  the whole ``(sequence, features)`` slab. Forward and backward agree with
  each other: with ``reference=``, each copy's output against the op's own
  on the sample shows it.

* :class:`CrossEntropyDividesByShapeZero` -- a mean cross-entropy whose
  forward averages over every row and whose backward divides by
  ``logits.shape[0]``: the row count of 2-D logits only (correct twin:
  :class:`reference_ops.edges.CrossEntropy`).

  Each is right at any size of a 2-D sample: the sizes check's variant with
  one more leading dim shows them. :class:`GroupNorm` follows torch's
  channels-first convention (dim 1 is the channels), so a leading dim means
  something else to it, as to ``F.group_norm``: it passes.

* :class:`TokenShiftBackwardDimOne` -- a ``(B, T, C)`` time shift whose
  forward shifts along ``dim=-2`` (it batches over a leading dim) and whose
  backward shifts along ``dim=1``. :class:`TokenShift` (forward along
  ``dim=1``, backward along ``dim=-2``) and :class:`ClassesAtDimOneCrossEntropy`
  (an ``(N, C)`` loss, classes at ``dim=1`` in forward, at the last dim in
  backward) are written for their rank and do not batch over a leading dim:
  nothing shows they are meant to take one, and they pass, with a note.

* :class:`WarpSoftmaxOddRowDropsLast` -- rows that fit one warp (up to
  ``WARP`` elements) take a path of two-element vector loads whose mask is
  per vector, not per element: an odd row loses its last element. The
  sample's rows are wider than a warp, and a row of one has a path of its
  own: only the sizes check's widths of 11 and 19 show it (with ``reference=``).

Correct twins: :class:`TiledSoftmax`, :class:`RowNormalize`, :class:`WarpSoftmax`, :class:`SplitKMatmul`,
:class:`BatchCentered`, :class:`OnlineSoftmax`, :class:`BlockRowMax`. :class:`FixedWidthScale` only supports rows of
``FIXED_WIDTH`` elements and raises otherwise: a size it refuses is noted,
never failed. The Triton kernel with a missing last program is in
:mod:`reference_ops.sizes_triton`.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from reference_ops.edges import CrossEntropy

__all__ = [
    "BLOCK",
    "ROWS",
    "SPLIT",
    "FIXED_WIDTH",
    "TiledSoftmax",
    "TiledSoftmaxTailReadsNextRow",
    "TiledSoftmaxGridFloor",
    "SplitKMatmul",
    "SplitKMatmulInclusiveEnd",
    "BatchCentered",
    "BatchCenteredSqueeze",
    "FixedWidthScale",
    "OnlineSoftmax",
    "RowNormalize",
    "WARP",
    "WarpSoftmax",
    "WarpSoftmaxOddRowDropsLast",
    "RowNormalizeBackwardSumsDimOne",
    "CrossEntropyDividesByShapeZero",
    "GroupNorm",
    "TokenShift",
    "TokenShiftBackwardDimOne",
    "token_shift_reference",
    "ClassesAtDimOneCrossEntropy",
    "group_norm_reference",
    "TiledSoftmaxRowsFromDimZero",
    "row_normalize_reference",
    "OnlineSoftmaxNoRescale",
    "BlockRowMax",
    "BlockRowMaxNoOffset",
    "softmax_reference",
    "row_max_reference",
    "matmul_reference",
    "batch_centered_reference",
    "scale_reference",
    "SAMPLES",
]

BLOCK = 4  # columns per block
ROWS = 2  # rows per program
SPLIT = 8  # reduction elements per split
FIXED_WIDTH = 8  # the only row width FixedWidthScale supports
STREAM_BLOCK = 16  # columns per block of the streaming kernels: the samples' rows fit one
WARP = 32  # the widest row WarpSoftmax reduces in one warp


# ---------------------------------------------------------------------------
# Row softmax: column blocks with a mask, programs of ROWS rows
# ---------------------------------------------------------------------------


def _softmax_forward(x, tail_reads_next_row=False):
    """Softmax over the last dim, each row read block by block from the flat buffer, as a kernel reads it."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.numel() == 0:
        return x.clone()
    blocks = -(-n // BLOCK)
    offsets = torch.arange(blocks * BLOCK, device=x.device).view(blocks, BLOCK)
    mask = offsets < n
    if tail_reads_next_row:  # BUG: the last block is loaded like a full one, without its mask
        mask = torch.ones_like(mask)
    flat = torch.cat([rows.reshape(-1), rows.new_zeros(blocks * BLOCK)])  # the allocation's slack past the end
    index = torch.arange(rows.shape[0], device=x.device).view(-1, 1, 1) * n + offsets
    tiles = torch.where(mask, flat[index], torch.full_like(flat[index], float("-inf")))
    peak = tiles.amax(dim=(1, 2), keepdim=True)
    exp = torch.exp(tiles - peak)
    y = exp / exp.sum(dim=(1, 2), keepdim=True)
    return y.reshape(rows.shape[0], blocks * BLOCK)[:, :n].reshape(x.shape)  # the store is masked


def _softmax_backward(y, grad, last_program_missing=False):
    """dx = y * (grad - sum(grad * y)), by programs of ROWS rows; differentiable, so double backward works."""
    n = y.shape[-1]
    rows, grads = y.reshape(-1, n), grad.reshape(-1, n)
    dx = rows * (grads - (grads * rows).sum(-1, keepdim=True))
    programs = -(-rows.shape[0] // ROWS)
    if last_program_missing:  # BUG: grid = rows // ROWS, so a last, partial program is never launched
        programs = rows.shape[0] // ROWS
    covered = min(programs * ROWS, rows.shape[0])
    dx = torch.cat([dx[:covered], torch.zeros_like(dx[covered:])])
    return dx.reshape(y.shape)


class TiledSoftmax(Function):
    """Softmax over the last dim, tiled in blocks of ``BLOCK`` columns with a mask for the last one."""

    tail_reads_next_row = False
    last_program_missing = False

    @staticmethod
    def forward(ctx, x):
        y = _softmax_forward(x, ctx_bug(ctx, "tail_reads_next_row"))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return _softmax_backward(y, grad, ctx_bug(ctx, "last_program_missing"))


def ctx_bug(ctx, name):
    """The planted bug ``name`` of the Function ``ctx`` belongs to (False for the correct twin)."""
    return getattr(getattr(ctx, "_forward_cls", None), name, False)


class TiledSoftmaxTailReadsNextRow(TiledSoftmax):
    """Bug: the last block is loaded without its mask: at a width that is not a multiple of ``BLOCK`` a row's
    max and sum take in the next row's first elements (the slack past the buffer for the last row)."""

    tail_reads_next_row = True


class TiledSoftmaxGridFloor(TiledSoftmax):
    """Bug: backward launches ``rows // ROWS`` programs: with a row count ``ROWS`` does not divide, the last
    rows get no gradient."""

    last_program_missing = True


def softmax_reference(x):
    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------------------
# Split-K matmul: the reduction in chunks of SPLIT, partial products added
# ---------------------------------------------------------------------------


def _split_k(x, weight, inclusive_end=False):
    """x @ weight.T with the reduction dim split into chunks of SPLIT elements."""
    k = x.shape[-1]
    out = x.new_zeros(x.shape[:-1] + weight.shape[:1])
    for start in range(0, k, SPLIT):
        stop = min(start + SPLIT + (1 if inclusive_end else 0), k)  # BUG when inclusive: [start, start + SPLIT]
        out = out + x[..., start:stop] @ weight[:, start:stop].T
    return out


class SplitKMatmul(Function):
    """``x @ weight.T``, the reduction over ``K`` split into chunks of ``SPLIT`` whose partial products add up."""

    @staticmethod
    def forward(x, weight):
        return _split_k(x, weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        return grad @ weight, rows.T @ x.reshape(-1, x.shape[-1])


class SplitKMatmulInclusiveEnd(SplitKMatmul):
    """Bug: each split ends one element late, so the first element of the next split is counted twice;
    right while ``K`` fits one split."""

    @staticmethod
    def forward(x, weight):
        return _split_k(x, weight, inclusive_end=True)


def matmul_reference(x, weight):
    return x @ weight.T


# ---------------------------------------------------------------------------
# Batch centering: the mean subtraction of a batch norm, with a weight
# ---------------------------------------------------------------------------


def _centered(x, squeeze=False):
    if squeeze:  # BUG: meant to accept (B, 1, N) too, it also squeezes a batch of one
        rows = x.squeeze()
        return (rows - rows.mean(0)).view_as(x)
    return x - x.mean(0, keepdim=True)


class BatchCentered(Function):
    """``(x - x.mean(0)) * weight`` for ``x`` of shape ``(B, N)`` and ``weight`` of shape ``(N,)``."""

    squeeze = False

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return _centered(x, ctx_bug(ctx, "squeeze")) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        squeeze = ctx_bug(ctx, "squeeze")
        return _centered(grad * weight, squeeze), (grad * _centered(x, squeeze)).sum(0)


class BatchCenteredSqueeze(BatchCentered):
    """Bug: ``x.squeeze()`` also drops a batch of one, so the mean is taken over the features; forward and
    backward share it (they agree with each other), so only ``reference=`` shows it."""

    squeeze = True


def batch_centered_reference(x, weight):
    return (x - x.mean(0, keepdim=True)) * weight


# ---------------------------------------------------------------------------
# A kernel built for one width: other widths are refused, not wrong
# ---------------------------------------------------------------------------


class FixedWidthScale(Function):
    """``x * weight`` for rows of exactly ``FIXED_WIDTH`` elements (a kernel specialised for one width); other
    widths raise ValueError."""

    @staticmethod
    def forward(ctx, x, weight):
        if x.shape[-1] != FIXED_WIDTH or weight.shape != (FIXED_WIDTH,):
            raise ValueError(f"FixedWidthScale is built for rows of {FIXED_WIDTH} elements, got x of shape "
                             f"{tuple(x.shape)} and weight of shape {tuple(weight.shape)}")
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad * weight, (grad * x).reshape(-1, FIXED_WIDTH).sum(0)


def scale_reference(x, weight):
    return x * weight


# ---------------------------------------------------------------------------
# Streaming reductions: a running state carried from block to block
# ---------------------------------------------------------------------------


def _online_softmax(x, rescale=True):
    """Softmax over the last dim in one pass over blocks of ``STREAM_BLOCK`` columns: a running max ``m`` and a
    running sum ``s`` of exp(x - m), rescaled by exp(m_old - m_new) whenever a block raises the max."""
    n = x.shape[-1]
    m = x.new_full(x.shape[:-1] + (1,), float("-inf"))
    s = x.new_zeros(x.shape[:-1] + (1,))
    for start in range(0, n, STREAM_BLOCK):
        block = x[..., start:start + STREAM_BLOCK]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        carried = s * torch.exp(m - m_new) if rescale else s  # BUG when not rescaled: s is relative to the old max
        s = carried + torch.exp(block - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / s


class OnlineSoftmax(Function):
    """Softmax over the last dim, streaming over blocks of ``STREAM_BLOCK`` columns (as flash attention does)."""

    @staticmethod
    def forward(ctx, x):
        y = _online_softmax(x, rescale=not ctx_bug(ctx, "forgets_rescale"))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


class OnlineSoftmaxNoRescale(OnlineSoftmax):
    """Bug: the running sum is not rescaled when a later block raises the running max: right while a row fits
    one block, or its largest value lies in its first block."""

    forgets_rescale = True


def _block_row_max(x, forget_offset=False):
    """(row max, its position): each block's max and position, then the best block's."""
    n = x.shape[-1]
    best = x.new_full(x.shape[:-1], float("-inf"))
    where = torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)
    for start in range(0, n, STREAM_BLOCK):
        values, positions = x[..., start:start + STREAM_BLOCK].max(-1)
        if not forget_offset:  # BUG when forgotten: the position within the block is taken for the row's
            positions = positions + start
        better = values > best
        best = torch.where(better, values, best)
        where = torch.where(better, positions, where)
    return best, where


class BlockRowMax(Function):
    """The max over the last dim, reduced block by block; the gradient goes to the max's position."""

    @staticmethod
    def forward(ctx, x):
        best, where = _block_row_max(x, forget_offset=ctx_bug(ctx, "forgets_offset"))
        ctx.save_for_backward(where)
        ctx.shape = x.shape
        return best

    @staticmethod
    def backward(ctx, grad):
        (where,) = ctx.saved_tensors
        return grad.new_zeros(ctx.shape).scatter(-1, where.unsqueeze(-1), grad.unsqueeze(-1))


class BlockRowMaxNoOffset(BlockRowMax):
    """Bug: the gradient goes to the max's position within its block: right while a row fits one block, or its
    largest value lies in its first block."""

    forgets_offset = True


def row_max_reference(x):
    return x.amax(-1)


# ---------------------------------------------------------------------------
# Written for (rows, features): right for any 2-D size, wrong for a 3-D activation
# ---------------------------------------------------------------------------


class RowNormalize(Function):
    """Each row (the last dim) scaled to unit L2 norm; backward is differentiable, so double backward works."""

    backward_dim = -1

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x / x.norm(dim=-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        norm = x.norm(dim=-1, keepdim=True)
        y = x / norm
        dim = ctx_bug(ctx, "backward_dim")  # BUG in the twin: 1, the last dim only for a 2-D input
        return (grad - y * (grad * y).sum(dim, keepdim=True)) / norm


class RowNormalizeBackwardSumsDimOne(RowNormalize):
    backward_dim = 1


def row_normalize_reference(x):
    return x / x.norm(dim=-1, keepdim=True)


class TiledSoftmaxRowsFromDimZero(Function):
    """BUG: rows are ``x.reshape(x.shape[0], -1)``, so a 3-D input's row is its whole (sequence, features) slab."""

    @staticmethod
    def forward(ctx, x):
        y = _softmax_forward(x.reshape(x.shape[0], -1)).reshape(x.shape)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return _softmax_backward(y.reshape(y.shape[0], -1), grad.reshape(y.shape[0], -1)).reshape(y.shape)


# ---------------------------------------------------------------------------
# A path for rows that fit one warp
# ---------------------------------------------------------------------------


class WarpSoftmax(Function):
    """Softmax over the last dim with three paths, as CUDA softmax kernels have: a row of one, rows that fit one
    warp (two-element vector loads, each element masked), and tiled rows (:class:`TiledSoftmax`'s)."""

    mask_per_vector = False

    @staticmethod
    def forward(ctx, x):
        n = x.shape[-1]
        if n == 1:
            y = torch.ones_like(x)
        elif n <= WARP:
            rows = x.reshape(-1, n)
            loaded = torch.arange(n, device=x.device) < n
            if ctx_bug(ctx, "mask_per_vector"):  # BUG: a pair is loaded only when both its elements are in the row
                loaded = torch.arange(n, device=x.device) // 2 * 2 + 1 < n
            rows = torch.where(loaded, rows, torch.full_like(rows, float("-inf")))
            y = torch.softmax(rows, -1).reshape(x.shape)
        else:
            y = _softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return _softmax_backward(y, grad)


class WarpSoftmaxOddRowDropsLast(WarpSoftmax):
    mask_per_vector = True


class CrossEntropyDividesByShapeZero(CrossEntropy):
    """BUG: backward divides by ``logits.shape[0]``, while forward averages over every row."""

    rows_from_dim_zero = True


# ---------------------------------------------------------------------------
# Written for one rank: right there, whatever one more leading dim would make of them
# ---------------------------------------------------------------------------


def _shifted(x, dim, back=False):
    """``x`` with every position along ``dim`` taking the previous one's values (the first gets zeros); ``back``:
    the next one's (the last gets zeros), the shift's adjoint."""
    n = x.shape[dim]
    kept = x.narrow(dim, 1, n - 1) if back else x.narrow(dim, 0, n - 1)
    zeros = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.cat([kept, zeros] if back else [zeros, kept], dim)


class TokenShift(Function):
    """A ``(B, T, C)`` token op: each token gets the previous token's features (RWKV's time shift). Written for
    three dims: forward shifts along ``dim=1``, backward along ``dim=-2``, the same dim at that rank. Given a
    4-D input it shifts along the batch in forward and along time in backward: it is not meant for one."""

    forward_dim, backward_dim = 1, -2

    @staticmethod
    def forward(ctx, x):
        ctx.dims = ctx_bug(ctx, "forward_dim"), ctx_bug(ctx, "backward_dim")
        return _shifted(x, ctx.dims[0])

    @staticmethod
    def backward(ctx, grad):
        return _shifted(grad, ctx.dims[1], back=True)


class TokenShiftBackwardDimOne(TokenShift):
    """BUG: forward shifts along ``dim=-2`` (time at any rank: it batches over a leading dim), backward along
    ``dim=1``, which is time only for three dims."""

    forward_dim, backward_dim = -2, 1


def token_shift_reference(x):
    """Time shift of a ``(B, T, C)`` activation, written for three dims (it refuses others)."""
    batch, _, channels = x.shape
    return torch.cat([x.new_zeros(batch, 1, channels), x[:, :-1]], 1)


class ClassesAtDimOneCrossEntropy(Function):
    """Mean cross-entropy of ``(N, C)`` logits against class indices ``(N,)``, written for two dims: forward
    takes the classes at ``dim=1`` (as ``F.cross_entropy`` does), backward at the last dim, the same dim for
    2-D logits. Given 3-D logits its forward normalizes over the rows: it is not meant for them."""

    @staticmethod
    def forward(ctx, logits, target):
        one_hot = torch.nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)
        ctx.save_for_backward(logits, one_hot)
        return -(logits.log_softmax(1) * one_hot).sum() / target.numel()

    @staticmethod
    def backward(ctx, grad):
        logits, one_hot = ctx.saved_tensors
        return grad * (logits.softmax(-1) - one_hot) / one_hot[..., 0].numel(), None


GROUPS = 2  # GroupNorm's channel groups


def _group_normalized(x):
    """``x`` (N, C, *) normalized over each sample's groups of channels (and its positions), in its shape."""
    groups = x.reshape(x.shape[0], GROUPS, -1)
    mean = groups.mean(-1, keepdim=True)
    rstd = torch.rsqrt(groups.var(-1, unbiased=False, keepdim=True) + 1e-5)
    return ((groups - mean) * rstd).reshape(x.shape), rstd


class GroupNorm(Function):
    """Channels-first group norm of ``x`` (N, C, *), without affine parameters; backward recomputes the statistics
    from ``x`` with differentiable ops, so double backward works."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _group_normalized(x)[0]

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        normalized, rstd = _group_normalized(x)
        grads = grad.reshape(x.shape[0], GROUPS, -1)
        flat = normalized.reshape(grads.shape)
        grad_x = rstd * (grads - grads.mean(-1, keepdim=True) - flat * (grads * flat).mean(-1, keepdim=True))
        return grad_x.reshape(x.shape)


def group_norm_reference(x):
    return torch.nn.functional.group_norm(x, GROUPS, eps=1e-5)


def _randn(*shape, generator=None):
    return torch.randn(*shape, generator=generator)


SAMPLES = {
    # power-of-two sizes that BLOCK, ROWS and SPLIT divide: every op here is right at them
    "softmax": lambda generator=None: [(_randn(4, 8, generator=generator),)],
    "matmul": lambda generator=None: [(_randn(2, 8, generator=generator), _randn(4, 8, generator=generator))],
    "batch_centered": lambda generator=None: [(_randn(4, 8, generator=generator),
                                               _randn(8, generator=generator) + 1.5)],
    "streaming": lambda generator=None: [(_randn(4, 8, generator=generator),)],
    "rows": lambda generator=None: [(_randn(4, 8, generator=generator),)],
    "channels": lambda generator=None: [(_randn(4, 6, 5, generator=generator),)],
    "logits": lambda generator=None: [(_randn(6, 5, generator=generator),
                                       torch.randint(0, 5, (6,), generator=generator))],
    "warp": lambda generator=None: [(_randn(4, 2 * WARP, generator=generator),)],
    "tokens": lambda generator=None: [(_randn(3, 6, 8, generator=generator),)],
    "fixed_width": lambda generator=None: [(_randn(4, FIXED_WIDTH, generator=generator),
                                            _randn(FIXED_WIDTH, generator=generator))],
}
"""Sample factories by family: ``SAMPLES["softmax"](generator)`` is a list of argument tuples."""
