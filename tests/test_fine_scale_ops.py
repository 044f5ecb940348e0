"""Ops whose differences cannot see their derivative at the checks' usual step are judged, or said not judged.

An op computing in float32 or bfloat16 for float64 inputs gives quantised
float64 differences; in its own dtype, one whose output turns faster than
the step averages its slopes. Each of these let a zero backward pass
gradcheck: the zero read as the average slope, as a value between two
kink slopes, or matched differences that did not move at all. The zero
twins fail; the correct ones pass, or are skipped naming what could not be
judged, and never fail.
"""

import pytest
import torch

from pytest_autograd import run_checks

HEADER = """
import pytest
import torch
from reference_ops.fine_scale import *
"""

OPS = [("Float32FastSine", "fast_sine_samples", "float32"),
       ("Float32LogSumExp", "log_sum_exp_samples", "float32"),
       ("Bfloat16ComputedTanh", "tanh_samples", "bfloat16")]


def marked(op, samples):
    return HEADER + f"""
@pytest.mark.autograd_op(op={op})
def test_op():
    return {samples}(torch.Generator().manual_seed(0))
"""


@pytest.mark.parametrize(("op", "samples", "dtype"), OPS)
def test_a_zero_backward_of_an_op_computing_below_float64_fails_gradcheck(pytester, run_pytest, op, samples,
                                                                          dtype):
    pytester.makepyfile(test_ops=marked(op + "ZeroGrad", samples))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"gradient of all outputs w.r.t. `x` does not match the numerical derivative in {dtype}",
        f"  check gradcheck, device cpu, dtype {dtype}, sample 0",
        "*got 0 (analytical)",
    ])


@pytest.mark.parametrize(("op", "samples", "dtype"), OPS)
def test_the_correct_op_computing_below_float64_fails_no_default_check(pytester, run_pytest, op, samples, dtype):
    pytester.makepyfile(test_ops=marked(op, samples))
    result = run_pytest("-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert "passed" in outcomes


@pytest.mark.parametrize("seed", range(6))
def test_a_zero_backward_of_a_fast_float32_sine_never_passes_gradcheck(seed):
    from reference_ops.fine_scale import Float32FastSineZeroGrad, fast_sine_samples

    (outcome,) = run_checks(Float32FastSineZeroGrad, *fast_sine_samples(torch.Generator().manual_seed(seed))[0],
                            checks="gradcheck", seed=seed, shrink=0)
    assert outcome.status == "failed", outcome.detail


@pytest.mark.parametrize("seed", range(6))
def test_the_correct_fast_float32_sine_never_fails_gradcheck(seed):
    # Its steps were 50 to 150 turns of the sine wide: the right gradient failed, a zero one passed.
    from reference_ops.fine_scale import Float32FastSine, fast_sine_samples

    (outcome,) = run_checks(Float32FastSine, *fast_sine_samples(torch.Generator().manual_seed(seed))[0],
                            checks="gradcheck", seed=seed, shrink=0)
    assert outcome.status != "failed", outcome.detail
    if outcome.status == "skipped":
        assert outcome.detail.startswith("gradcheck: central differences cannot judge the gradient w.r.t. `x` "
                                         "(sample 0, float32; at "), outcome.detail


def test_a_check_whose_differences_tell_nothing_is_skipped_naming_the_argument():
    from reference_ops.fine_scale import Bfloat16ComputedTanh, tanh_samples

    (outcome,) = run_checks(Bfloat16ComputedTanh, *tanh_samples(torch.Generator().manual_seed(0))[0],
                            checks="gradcheck", shrink=0)
    assert outcome.status == "skipped"
    assert outcome.detail.startswith("gradcheck: central differences cannot judge the gradient w.r.t. `x` "
                                     "(sample 0, bfloat16; at "), outcome.detail
    assert "any gradient would pass there" in outcome.detail
    assert "Give reference= (gradients against its float64 ones on the same rounded inputs)" in outcome.detail


def test_a_reference_judges_the_op_the_differences_cannot():
    from reference_ops.fine_scale import (
        Bfloat16ComputedTanh,
        Bfloat16ComputedTanhZeroGrad,
        tanh_samples,
    )

    x = tanh_samples(torch.Generator().manual_seed(0))[0][0]
    (right,) = run_checks(Bfloat16ComputedTanh, x, reference=torch.tanh, checks="gradcheck", shrink=0)
    (zero,) = run_checks(Bfloat16ComputedTanhZeroGrad, x, reference=torch.tanh, checks="gradcheck", shrink=0)
    assert right.status == "passed", right.detail
    assert zero.status == "failed", zero.detail


def test_the_probe_names_the_16_bit_dtype_an_op_computes_in():
    from pytest_autograd.checks._float32_blind import float32_blind_plan
    from pytest_autograd.checks.base import CheckContext
    from pytest_autograd.engine.case import Sample, build_case
    from reference_ops.fine_scale import Bfloat16ComputedTanh, Float32LogSumExp, log_sum_exp_samples, tanh_samples

    def plan(op, sample):
        case = build_case({"op": op}, [Sample(*sample)])
        return float32_blind_plan(CheckContext("gradcheck", case, "cpu", 0), case.samples[0])

    generator = torch.Generator().manual_seed(0)
    assert plan(Bfloat16ComputedTanh.apply, tanh_samples(generator)[0]).dtype == torch.bfloat16
    assert plan(Float32LogSumExp.apply, log_sum_exp_samples(generator)[0]).dtype == torch.float32
    saturated = torch.randn(64, generator=generator) * 8  # mostly flat in float32: flat is not 16-bit rounding
    assert plan(lambda v: torch.tanh(v.float()).to(v.dtype), (saturated,)).dtype == torch.float32


@pytest.mark.parametrize("seed", range(4))
def test_a_float32_rms_norm_over_rows_of_one_element_is_not_called_nonlinear_in_grad_output(seed):
    # The linearity test allowed a plain atol on v . J, while each Jacobian element had passed within its own
    # allowance: the float32 rounding of the correct backward added up past it.
    from reference_ops.fused import FusedRMSNorm

    generator = torch.Generator().manual_seed(seed)
    x, weight = torch.randn(6, 1, generator=generator), torch.randn(1, generator=generator)
    (outcome,) = run_checks(FusedRMSNorm, x, weight, checks="gradcheck", seed=seed, shrink=0)
    assert outcome.status != "failed", outcome.detail


def test_a_backward_right_only_for_positive_grad_outputs_is_still_called_nonlinear():
    class PositiveOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad.abs() * x.cos()

    x = torch.randn(5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (outcome,) = run_checks(PositiveOnly, x, checks="gradcheck", shrink=0)
    assert outcome.status == "failed"
    assert "so backward is not linear in grad_output" in outcome.detail, outcome.detail


def _nan_above_half(slope):
    class NanAboveHalf(torch.autograd.Function):
        """2x up to 0.5, NaN past it: a float32-only op whose domain ends within gradcheck's float32 step."""

        @staticmethod
        def forward(ctx, x):
            if x.dtype != torch.float32:
                raise TypeError("float32 only")
            return torch.where(x > 0.5, torch.full_like(x, float("nan")), 2 * x)

        @staticmethod
        def backward(ctx, grad):
            return slope * grad

    return NanAboveHalf


def test_a_float32_only_op_whose_step_leaves_its_domain_is_judged_at_a_finer_step_inside_it():
    x = torch.full((8,), 0.4999)  # the float32 step, 0.0025, crosses 0.5
    (right,) = run_checks(_nan_above_half(2.0), x, checks="gradcheck", shrink=0)
    assert right.status == "passed", right.detail
    (wrong,) = run_checks(_nan_above_half(3.0), x, checks="gradcheck", shrink=0)
    assert wrong.status == "failed"
    assert "does not match the numerical derivative in float32" in wrong.detail, wrong.detail


def test_a_float32_only_op_not_finite_at_every_step_around_the_sample_is_not_judged_there():
    x = torch.full((8,), 0.5 - 2e-7)  # within a float32 rounding of the edge: no step stays inside
    (outcome,) = run_checks(_nan_above_half(2.0), x, checks="gradcheck", shrink=0)
    assert outcome.status == "skipped", outcome.detail
    assert "the outputs turn inf/NaN at every step down to" in outcome.detail, outcome.detail
