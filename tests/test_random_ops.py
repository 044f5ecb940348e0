"""Ops drawing from torch's global random generator: judged with their draws alike wherever runs are compared."""

import textwrap

import torch
from torch.autograd import Function

from pytest_autograd.engine.api import run_checks
from reference_ops.random_ops import (
    Dropout,
    DropoutBackwardIgnoresMask,
    DropoutFixedDraw,
    DropoutFixedDrawReadsGradContiguous,
    dropout_samples,
)

FIXED = "the op draws random numbers from torch's global generator"


def outcomes(op, checks, **options):
    return {o.check: o for o in run_checks(op, samples=dropout_samples(), checks=checks, **options)}


def test_a_correct_dropout_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest
        from reference_ops.random_ops import Dropout, DropoutFixedDraw, dropout_samples

        @pytest.mark.autograd_op(op=Dropout)
        def test_dropout():
            return dropout_samples()

        @pytest.mark.autograd_op(op=DropoutFixedDraw)
        def test_dropout_fixed_draw():
            return dropout_samples()
    """))
    result = run_pytest("-rs")
    assert result.ret == 0, result.stdout.str()


def test_a_dropout_drawing_in_the_inputs_dtype_and_order_is_judged_with_its_draws_fixed_by_position():
    found = outcomes(Dropout, ["precision", "extreme", "noncontiguous"])
    for name, outcome in found.items():
        assert outcome.status == "passed", (name, outcome.detail)
        assert FIXED in outcome.detail and "judged with its draws fixed by each element's position" in outcome.detail


def test_a_dropout_whose_mask_is_drawn_alike_in_every_run_needs_no_fixing():
    found = outcomes(DropoutFixedDraw, ["precision", "extreme", "noncontiguous"])
    assert {name: o.status for name, o in found.items()} == {
        "precision": "passed", "extreme": "passed", "noncontiguous": "passed"}
    assert not any(FIXED in o.detail for o in found.values())


def test_a_dropout_ignoring_its_mask_in_backward_fails_gradcheck():
    (outcome,) = run_checks(DropoutBackwardIgnoresMask, samples=dropout_samples(), checks=["gradcheck"])
    assert outcome.status == "failed"
    assert "gradient of output w.r.t. `x` does not match the numerical derivative" in outcome.detail


def test_a_layout_bug_in_a_random_op_still_fails_noncontiguous():
    (outcome,) = run_checks(DropoutFixedDrawReadsGradContiguous, samples=dropout_samples(), checks=["noncontiguous"])
    assert outcome.status == "failed", outcome.detail
    assert "gradient w.r.t. `x` differs from the contiguous run when grad_output is transposed" in outcome.detail


class DropoutReadsInputContiguous(Dropout):
    """BUG: forward reads its input's memory as if it were contiguous."""

    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(keep)
        return torch.as_strided(x, x.shape, [x.shape[-1], 1], x.storage_offset()) * keep


class DropoutWrongScale(Dropout):
    """BUG: kept elements scaled by 1/p instead of 1/(1 - p), in forward and backward alike."""

    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand_like(x) >= p).to(x.dtype) / p
        ctx.save_for_backward(keep)
        return x * keep


def dropout_reference(x, p):
    return x * ((torch.rand_like(x) >= p).to(x.dtype) / (1 - p))


class DropoutSoftmaxOverflow(Function):
    """BUG: a fused softmax + dropout without the max subtracted: NaN at large |x| in float32."""

    @staticmethod
    def forward(ctx, x, p):
        keep = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
        e = x.exp()
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y, keep)
        return y * keep

    @staticmethod
    def backward(ctx, grad):
        y, keep = ctx.saved_tensors
        g = grad * keep
        return y * (g - (g * y).sum(-1, keepdim=True)), None


def test_a_random_ops_forward_layout_bug_fails_noncontiguous_with_its_draws_alike():
    (outcome,) = run_checks(DropoutReadsInputContiguous, samples=dropout_samples(), checks=["noncontiguous"])
    assert outcome.status == "failed", outcome.detail
    assert "output differs from the contiguous run when `x`" in outcome.detail


def test_a_random_op_off_from_a_reference_drawing_as_it_does_fails_reference():
    (outcome,) = run_checks(DropoutWrongScale, samples=dropout_samples(), checks=["reference"],
                            reference=dropout_reference)
    assert outcome.status == "failed", outcome.detail
    assert "output of the op differs from the reference" in outcome.detail


def test_a_random_op_overflowing_at_large_inputs_fails_extreme():
    (outcome,) = run_checks(DropoutSoftmaxOverflow, samples=dropout_samples(), checks=["extreme"])
    assert outcome.status == "failed", outcome.detail
    assert "output is NaN in float32 for inputs scaled to max |x| = " in outcome.detail


def test_an_op_started_from_random_numbers_with_a_wrong_formula_still_fails_its_reference():
    def spectral_normalized_wrong(w):
        u = torch.randn(w.shape[0], dtype=w.dtype)  # power iteration from a random start
        for _ in range(50):
            v = torch.nn.functional.normalize(w.t() @ u, dim=0)
            u = torch.nn.functional.normalize(w @ v, dim=0)
        sigma = u @ w @ v
        return w / sigma ** 2  # BUG: sigma squared

    def spectral_normalized(w):
        return w / torch.linalg.matrix_norm(w, ord=2)

    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    (outcome,) = run_checks(spectral_normalized_wrong, w, checks=["reference"], reference=spectral_normalized)
    assert outcome.status == "failed", outcome.detail
    assert FIXED not in outcome.detail


def test_fixed_draws_are_the_same_in_every_dtype_and_layout_and_leave_a_generators_own_draws_alone():
    from pytest_autograd.engine.random_draws import FixedDraws

    x = torch.randn(4, 6)
    own = torch.Generator().manual_seed(1)
    with FixedDraws() as mode:
        contiguous, transposed = torch.rand_like(x), torch.rand_like(x.t().contiguous().t())
        wide = torch.rand_like(x.double())
        dropped, (fused, _) = torch.nn.functional.dropout(x, 0.3), torch.ops.aten.native_dropout(x, 0.3, True)
        drawn = torch.rand(3, generator=own)
    assert mode.drew
    assert torch.equal(contiguous, transposed) and torch.allclose(contiguous.double(), wide)
    assert torch.equal(dropped, fused), "the CPU's dropout (bernoulli) and the fused one (CUDA's) draw alike"
    assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(1)))


def test_a_dropout_judged_with_fixed_draws_keeps_that_runs_notes_and_not_the_failed_ones():
    (outcome,) = run_checks(Dropout, samples=dropout_samples(), checks=["noncontiguous"])
    assert outcome.status == "passed", outcome.detail
    assert outcome.detail.count(FIXED) == 1
    assert "differs" not in outcome.detail
