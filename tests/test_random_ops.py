"""Ops drawing from torch's global random generator: judged where their runs can draw alike, skipped where not."""

import textwrap

from pytest_autograd.engine.api import run_checks
from reference_ops.random_ops import (
    Dropout,
    DropoutBackwardIgnoresMask,
    DropoutFixedDraw,
    DropoutFixedDrawReadsGradContiguous,
    dropout_samples,
)

RANDOM = "the op draws random numbers from torch's global generator"


def outcomes(op, checks=None, **options):
    return {o.check: o for o in run_checks(op, samples=dropout_samples(), checks=checks, **options)}


def test_a_correct_dropout_passes_every_default_check_it_can_judge(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest
        from reference_ops.random_ops import Dropout, DropoutFixedDraw, dropout_samples

        @pytest.mark.autograd_op(op=Dropout, skip=["determinism"])
        def test_dropout():
            return dropout_samples()

        @pytest.mark.autograd_op(op=DropoutFixedDraw, skip=["determinism"])
        def test_dropout_fixed_draw():
            return dropout_samples()
    """))
    result = run_pytest("-rs")
    assert result.ret == 0, result.stdout.str()


def test_checks_comparing_runs_in_another_dtype_skip_a_dropout_drawing_in_the_inputs_dtype_and_say_why():
    found = outcomes(Dropout, checks=["precision", "extreme"])
    for name in ("precision", "extreme"):
        assert found[name].status == "skipped", found[name].detail
        assert RANDOM in found[name].detail and f"and {name} compares runs that draw different numbers" in \
            found[name].detail


def test_a_dropout_whose_mask_is_drawn_alike_in_every_run_is_judged_by_precision_and_extreme():
    found = outcomes(DropoutFixedDraw, checks=["precision", "extreme", "noncontiguous"])
    assert {name: o.status for name, o in found.items()} == {
        "precision": "passed", "extreme": "passed", "noncontiguous": "passed"}


def test_noncontiguous_leaves_out_only_the_layouts_where_the_mask_is_drawn_in_another_order():
    (outcome,) = run_checks(Dropout, samples=dropout_samples(), checks=["noncontiguous"])
    assert outcome.status == "passed", outcome.detail
    assert "the transposed layout not judged: the op draws random numbers" in outcome.detail
    assert "sliced layout not judged" not in outcome.detail


def test_a_dropout_ignoring_its_mask_in_backward_fails_gradcheck():
    (outcome,) = run_checks(DropoutBackwardIgnoresMask, samples=dropout_samples(), checks=["gradcheck"])
    assert outcome.status == "failed"
    assert "gradient of output w.r.t. `x` does not match the numerical derivative" in outcome.detail


def test_a_layout_bug_in_a_random_op_is_not_excused_as_its_draws():
    (outcome,) = run_checks(DropoutFixedDrawReadsGradContiguous, samples=dropout_samples(), checks=["noncontiguous"])
    assert outcome.status == "failed", outcome.detail
    assert "gradient w.r.t. `x` differs from the contiguous run when grad_output is transposed" in outcome.detail


def test_a_deterministic_op_differing_from_its_reference_is_not_taken_for_a_random_one():
    import torch

    def float16_inside(x):
        return (x.half() * 3.0).to(x.dtype)

    (outcome,) = run_checks(float16_inside, torch.randn(64, dtype=torch.float32), checks=["reference"],
                            reference=lambda x: x * 3.0)
    assert outcome.status == "failed", outcome.detail
    assert RANDOM not in outcome.detail
