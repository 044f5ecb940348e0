"""The overflow check puts an inf, then a NaN, in grad_output: it must reach every gradient element it flows into."""

import textwrap

import pytest
import torch

from pytest_autograd.engine.api import run_checks
from reference_ops import MyReLU
from reference_ops.training import ReLUWhere, ScaleColumns, columns_samples, relu_by_mask, samples

HINT = "*hint: do not clamp `grad`, nan_to_num it, mask its non-finite values or saturate it with fmax/fmin*GradScaler*"


def run(pytester, run_pytest, op):
    pytester.makepyfile(test_ops=textwrap.dedent(f"""
        import pytest, torch
        from reference_ops.training import {op}, columns_samples

        @pytest.mark.autograd_op(op={op}, reference=lambda x, w: x * w)
        def test_op():
            return columns_samples(torch.Generator().manual_seed(0))
    """))
    return run_pytest("--autograd-checks=overflow")


@pytest.mark.parametrize("op", ["ScaleColumnsClampsGradOutput", "ScaleColumnsZeroesNonFiniteGradOutput",
                                "ScaleColumnsMasksNonFiniteGradOutput", "ScaleColumnsSaturatesGradOutput"])
def test_overflow_fails_a_backward_that_hides_an_inf_in_grad_output(pytester, run_pytest, op):
    result = run(pytester, run_pytest, op)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*an inf in `grad` does not reach the gradient w.r.t. `x`: 1 of the 1 element(s) it flows into stay finite",
        "*check overflow, device cpu, dtype float32, sample 0",
        "*output: output, argument: x",
        "*worst element: grad x[[]*[]]: * with grad[[]*[]] = inf (the reference's gradient there is not finite)",
        "*set to inf, as a backward from a loss scaled past the dtype's range gives; torch.amp.GradScaler skips the "
        "step only when it finds an inf or NaN in the gradients",
        HINT,
    ])


def test_overflow_fails_a_backward_that_hides_a_nan_but_lets_an_inf_through():
    class DropsNaN(ScaleColumns):
        @staticmethod
        def backward(ctx, grad):
            return ScaleColumns.backward(ctx, torch.where(grad.isnan(), torch.zeros_like(grad), grad))

    (outcome,) = run_checks(DropsNaN, samples=columns_samples(), checks=["overflow"])
    assert outcome.status == "failed"
    assert "a NaN in `grad` does not reach the gradient w.r.t. `x`" in outcome.detail


def test_a_where_that_leaves_dropped_elements_at_zero_passes_against_a_reference_giving_nan_there():
    (outcome,) = run_checks(ReLUWhere, samples=samples(), checks=["overflow"], reference=relu_by_mask)
    assert outcome.status == "passed", outcome.detail


def test_a_backward_multiplying_by_the_mask_passes_though_it_is_nan_where_the_reference_is_finite():
    (outcome,) = run_checks(MyReLU, samples=samples(), checks=["overflow"], reference=torch.relu)
    assert outcome.status == "passed", outcome.detail


def test_without_a_reference_the_elements_backward_reads_the_cotangent_into_are_judged(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest, torch
        from reference_ops.training import ScaleColumnsZeroesNonFiniteGradOutput, columns_samples

        @pytest.mark.autograd_op(op=ScaleColumnsZeroesNonFiniteGradOutput)
        def test_op():
            return columns_samples(torch.Generator().manual_seed(0))
    """))
    result = run_pytest("--autograd-checks=overflow")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worst element: grad x[[]*[]]: *0 with grad[[]*[]] = inf",
                                 "*those elements of the gradient w.r.t. `x` move: backward does read it into them"])
