"""A backward may return a sparse gradient for a dense input (a sparse embedding): every check judges it as the
dense gradient it stands for, and still catches the planted bugs."""

import textwrap

import torch

from pytest_autograd import Sample
from pytest_autograd.engine.api import run_checks
from reference_ops.sparse_gradients import (
    SparseEmbeddingAssumesContiguousWeight,
    SparseEmbeddingOffByOneRow,
    embedding_reference,
    embedding_samples,
)


def outcomes(op, checks=None):
    samples = [Sample(*sample) for sample in embedding_samples(torch.Generator().manual_seed(0))]
    return {o.check: o for o in run_checks(op, samples=samples, reference=embedding_reference, checks=checks,
                                           shrink=0)}


def test_an_embedding_whose_weight_gradient_is_sparse_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest, torch
        from reference_ops.sparse_gradients import SparseEmbedding, embedding_reference, embedding_samples

        @pytest.mark.autograd_op(op=SparseEmbedding, reference=embedding_reference)
        def test_embedding():
            return embedding_samples(torch.Generator().manual_seed(0))
    """))
    result = run_pytest("-rs")
    outcome = result.parseoutcomes()
    assert outcome.get("passed", 0) >= 14 and "failed" not in outcome and "error" not in outcome, outcome


def test_a_sparse_gradient_written_to_the_wrong_row_fails_gradcheck_naming_the_weight():
    found = outcomes(SparseEmbeddingOffByOneRow, ["gradcheck", "reference"])
    assert found["gradcheck"].status == "failed"
    assert "gradient of output w.r.t. `weight` does not match the numerical derivative" in found["gradcheck"].detail
    assert found["reference"].status == "failed"
    assert "gradient w.r.t. `weight` from the op differs from the reference" in found["reference"].detail


def test_an_op_with_a_sparse_gradient_reading_its_weight_as_contiguous_fails_noncontiguous():
    found = outcomes(SparseEmbeddingAssumesContiguousWeight, ["noncontiguous"])
    assert found["noncontiguous"].status == "failed"
    assert "output differs from the contiguous run when `weight` is transposed" in found["noncontiguous"].detail


class _SparseTableModel(torch.nn.Module):
    """A custom sparse-gradient lookup beside torch's own sparse embedding, then a custom linear layer."""

    def __init__(self, lookup):
        super().__init__()
        self.lookup = lookup
        self.table = torch.nn.Parameter(torch.randn(20, 8))
        self.torch_table = torch.nn.Embedding(20, 8, sparse=True)
        self.weight = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, idx):
        from reference_ops import LinearFunction

        return LinearFunction.apply(self.lookup.apply(self.table, idx) + self.torch_table(idx), self.weight)


def test_the_model_scan_passes_a_sparse_lookup_and_names_its_twin_writing_to_the_wrong_row():
    from pytest_autograd import autograd_scan
    from reference_ops.sparse_gradients import SparseEmbedding

    idx = torch.tensor([[1, 2, 2], [5, 19, 0]])
    right = autograd_scan(_SparseTableModel(SparseEmbedding), idx)
    assert not right.wrong and len(right.passed) == 2
    wrong = autograd_scan(_SparseTableModel(SparseEmbeddingOffByOneRow), idx)
    assert [verdict.scanned.name for verdict in wrong.wrong] == ["SparseEmbeddingOffByOneRow"]
