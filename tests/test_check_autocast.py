"""The autocast check runs forward under torch.autocast and backward after it, as a training step does."""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from pytest_autograd.engine.api import run_checks
from reference_ops.training import (
    Float32OnlyKernel,
    LinearAutocast,
    LinearInFloat32,
    LinearThenNorm,
    linear_samples,
    linear_then_norm,
    norm_samples,
)


def run(pytester, run_pytest, op, factory, reference):
    pytester.makepyfile(test_ops=textwrap.dedent(f"""
        import pytest, torch
        from reference_ops.training import {op}, {factory}, linear_then_norm

        @pytest.mark.autograd_op(op={op}, reference={reference})
        def test_op():
            return {factory}(torch.Generator().manual_seed(0))
    """))
    return run_pytest("--autograd-checks=autocast")


def test_autocast_fails_a_function_whose_backward_meets_the_16_bit_output_of_its_forward(pytester, run_pytest):
    result = run(pytester, run_pytest, "LinearWithoutCustomFwd", "linear_samples", "torch.nn.functional.linear")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's backward raised RuntimeError under torch.autocast('cpu', dtype=torch.bfloat16), after its forward "
        "ran there: expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float",
        "*check autocast, device cpu, dtype float32, sample 0",
        "*backward runs after the autocast region, as in a training step, on the tensors forward saved under it",
        "*at *reference_ops/training.py:* in backward",
        "*hint: decorate forward with @torch.amp.custom_fwd(device_type='cpu') and backward with "
        "@torch.amp.custom_bwd(device_type='cpu')*",
    ])


def test_autocast_says_to_decorate_backward_when_only_forward_is_custom_fwd(pytester, run_pytest):
    result = run(pytester, run_pytest, "LinearCustomFwdWithoutCustomBwd", "linear_samples",
                 "torch.nn.functional.linear")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*hint: forward is @torch.amp.custom_fwd but backward is not: decorate backward with "
        "@torch.amp.custom_bwd(device_type='cpu') too*",
    ])


def test_autocast_fails_statistics_computed_in_the_activation_dtype_against_the_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, "LinearThenNormOnePassVariance", "norm_samples", "linear_then_norm")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*under torch.autocast('cpu', dtype=torch.bfloat16) is further from float64 than the reference's under the "
        "same autocast",
        "*check autocast, device cpu, dtype bfloat16, sample 0",
        "*normwise error * > budget * (3 x the reference's own error * under autocast, plus one bfloat16 ulp)",
        "*the op run plainly in float32 is within that budget: autocast, not its maths, makes the difference",
        "*hint: under autocast, torch ops inside the op compute in bfloat16; torch's own ops for reductions, norms, "
        "softmax and losses run in float32 there: run the op's reductions in float32*",
    ])


def test_without_a_reference_autocast_fails_an_error_no_rounding_explains(pytester, run_pytest):
    result = run(pytester, run_pytest, "LinearThenNormOnePassVariance", "norm_samples", "None")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*under torch.autocast('cpu', dtype=torch.bfloat16) is far from the op's own float32 run",
        "*normwise error * > 0.1, beyond what rounding to bfloat16 explains",
    ])


@pytest.mark.parametrize("op, factory, reference", [
    (LinearAutocast, linear_samples, F.linear),
    (LinearInFloat32, linear_samples, F.linear),  # float32 output where F.linear's is bfloat16: by design
    (LinearThenNorm, norm_samples, linear_then_norm),
    (LinearThenNorm, norm_samples, None),
])
def test_ops_that_handle_autocast_pass(op, factory, reference):
    (outcome,) = run_checks(op, samples=factory(), checks=["autocast"], reference=reference)
    assert outcome.status == "passed", outcome.detail
    assert outcome.detail == ""


def test_an_op_that_refuses_the_autocast_dtype_in_forward_is_noted():
    (outcome,) = run_checks(Float32OnlyKernel, samples=linear_samples(), checks=["autocast"])
    assert outcome.status == "passed"
    assert ("autocast: not judged under torch.autocast('cpu', dtype=torch.bfloat16): the op's forward raises there "
            "(TypeError: tanh kernel: expected float32 tensors, got torch.bfloat16)") in outcome.detail


def test_an_op_whose_maths_differ_from_the_reference_even_plainly_is_left_to_the_reference_check():
    def twice_linear(x, w):
        return 2 * (x @ w.T)

    (outcome,) = run_checks(twice_linear, samples=linear_samples(), checks=["autocast"], reference=F.linear)
    assert outcome.status == "passed"
    assert "the op run plainly is already off from the reference by" in outcome.detail


def test_float64_samples_are_run_as_float32_as_a_model_hands_them():
    x, w = linear_samples()[0]
    (outcome,) = run_checks(LinearAutocast, x.double(), w.double(), checks=["autocast"], reference=F.linear)
    assert outcome.status == "passed", outcome.detail


def test_an_op_drawing_random_numbers_is_judged_with_its_draws_alike():
    def dropout_linear(x, w):
        return F.dropout(x @ w.T, 0.25)

    (outcome,) = run_checks(dropout_linear, samples=linear_samples(), checks=["autocast"],
                            reference=lambda x, w: F.dropout(F.linear(x, w), 0.25))
    assert outcome.status == "passed", outcome.detail
    assert torch.is_autocast_enabled("cpu") is False
