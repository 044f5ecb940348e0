"""The grad_metadata check inspects the raw gradients backward returns, before the engine casts or sums them."""

import textwrap

LINEAR_RETURNING = """
import pytest, torch

class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        return input @ weight.T + bias

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        return {grad_input}, grad.T @ input, {grad_bias}

@pytest.mark.autograd_op(op=Linear)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
"""


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=grad_metadata", *args)


def test_grad_metadata_fails_a_float64_op_whose_backward_returns_float32(pytester, run_pytest):
    result = run(pytester, run_pytest, LINEAR_RETURNING.format(
        grad_input="grad.float() @ weight.float()", grad_bias="grad.sum(0)"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*backward returns the gradient of `input` as float32, but `input` is float64; autograd casts it "
        "silently: the float64 gradient then carries only float32 precision"),
        "*check grad_metadata, device cpu, dtype float64, sample 0",
        "*argument: input",
        "*raw gradient: float32[[]3, 4[]] on cpu; input: float64[[]3, 4[]] on cpu",
        "*hint: compute the gradient in the input's dtype*",
    ])


def test_grad_metadata_fails_a_backward_that_computes_in_float32_and_casts_back(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearFloat32Backward

        @pytest.mark.autograd_op(op=LinearFloat32Backward)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*backward returns a float64 gradient for `input` whose 12 non-zero values are all exactly float32 "
        "numbers: backward computes in float32 and casts back"),
        "*dtype float64*",
    ])


def test_grad_metadata_only_warns_about_a_gradient_the_engine_sums_over_broadcast_dims(pytester, run_pytest):
    result = run(pytester, run_pytest, LINEAR_RETURNING.format(grad_input="grad @ weight", grad_bias="grad"))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        ("*HygieneWarning: Linear: backward returns the gradient of `bias` with shape [[]3, 5[]] for an input "
        "of shape [[]5[]]; autograd sums it over the broadcast dimensions*"),
    ])


def test_grad_metadata_fails_a_gradient_shape_the_engine_cannot_repair(pytester, run_pytest):
    result = run(pytester, run_pytest, LINEAR_RETURNING.format(grad_input="grad @ weight", grad_bias="grad.T"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*backward returns the gradient of `bias` with shape [[]5, 3[]], which cannot be summed to the input's "
        "shape [[]5[]]"),
    ])


def test_grad_metadata_passes_correct_functions_and_plain_functions(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import (AddOneInPlace, LinearFunction, LinearFunctionSetupContext, MulConstant,
                                   ScaleOnceDifferentiable, SortWithIndices, SplitHalves)

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
            return [(x, w, b), (x, w, None)]

        @pytest.mark.autograd_op(op=LinearFunctionSetupContext)
        def test_linear_setup_context():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_add_one():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=MulConstant)
        def test_mul_constant():
            return [(torch.randn(3, 4), 2.5)]

        @pytest.mark.autograd_op(op=ScaleOnceDifferentiable)
        def test_scale():
            return [(torch.randn(5),)]

        @pytest.mark.autograd_op(op=torch.nn.functional.linear)
        def test_plain_function():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
    """, "-W", "error::pytest_autograd.checks._hygiene.HygieneWarning")
    result.assert_outcomes(passed=8)


def test_grad_metadata_passes_an_op_that_computes_and_returns_float32_by_design(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest
import torch
from reference_ops.low_precision import GatedComputesInFloat32, gated_samples

@pytest.mark.autograd_op(op=GatedComputesInFloat32)
def test_gated():
    return [tuple(t.double() for t in sample) for sample in gated_samples()]
""")
    run_pytest("--autograd-checks=grad_metadata").assert_outcomes(passed=1)
