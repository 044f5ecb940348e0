"""An embedding lookup whose backward returns a sparse gradient for the weight, as ``nn.Embedding(sparse=True)``
and large-table embedding kernels do, with planted-bug twins.

Autograd hands a sparse gradient on as it is, even for a dense weight; the
checks compare gradients element by element, as dense tensors.

* :class:`SparseEmbedding` -- correct: ``weight[idx]``, the weight's gradient a sparse COO tensor;
* :class:`SparseEmbeddingOffByOneRow` -- bug: each looked-up row's gradient lands on the next row;
* :class:`SparseEmbeddingAssumesContiguousWeight` -- bug: forward reads the weight's storage as if it were
  contiguous (a kernel indexing ``data_ptr()``), wrong for a transposed weight.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "SparseEmbedding",
    "SparseEmbeddingOffByOneRow",
    "SparseEmbeddingAssumesContiguousWeight",
    "embedding_reference",
    "embedding_samples",
]


class SparseEmbedding(Function):
    """``weight[idx]``; backward returns the weight's gradient as a sparse COO tensor (rows ``idx``)."""

    row_shift = 0  # planted in a twin: the row each gradient lands on

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.save_for_backward(idx)
        ctx.rows = weight.shape[0]
        return weight[idx]

    @classmethod
    def backward(cls, ctx, grad):
        (idx,) = ctx.saved_tensors
        rows = (idx.reshape(1, -1) + cls.row_shift) % ctx.rows
        values = grad.reshape(-1, grad.shape[-1])
        return torch.sparse_coo_tensor(rows, values, (ctx.rows, grad.shape[-1]), check_invariants=True), None


class SparseEmbeddingOffByOneRow(SparseEmbedding):
    """Bug: each looked-up row's gradient is written to the next row of the table."""

    row_shift = 1


class SparseEmbeddingAssumesContiguousWeight(SparseEmbedding):
    """Bug: forward reads the weight's storage as a contiguous ``(rows, dim)`` table, whatever its strides."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.save_for_backward(idx)
        ctx.rows = weight.shape[0]
        table = weight.as_strided(weight.shape, (weight.shape[1], 1), weight.storage_offset())
        return table[idx]


def embedding_reference(weight, idx):
    return torch.nn.functional.embedding(idx, weight)


def embedding_samples(generator=None):
    """A 12-row table of 6-wide rows, looked up with repeats (gradients of a repeated row add up)."""
    weight = torch.randn(12, 6, generator=generator)
    idx = torch.tensor([[1, 3, 3, 7], [0, 11, 2, 3]])
    return [(weight, idx)]
