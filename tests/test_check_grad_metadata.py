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
        "*raw gradient: float32[[]3, 4[]] on cpu, returned by Linear's backward; input: float64[[]3, 4[]] on cpu",
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


MIXED = """
import pytest, torch
from reference_ops.mixed_precision import *

@pytest.mark.autograd_op(op={op}, reference=mixed_linear_reference{extra})
def test_linear():
    return mixed_linear_samples(torch.Generator().manual_seed(0))
"""


def test_grad_metadata_fails_a_bfloat16_gradient_returned_for_a_float32_master_weight(pytester, run_pytest):
    # The engine casts it to float32 before anyone sees it; only the sample's own mixed dtypes show the bug.
    result = run(pytester, run_pytest, MIXED.format(op="MixedPrecisionLinearBf16WeightGrad", extra=""))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("backward returns the gradient of `weight` as bfloat16, but `weight` is float32; autograd casts it "
         "silently: the float32 gradient then carries only bfloat16 precision"),
        "  check grad_metadata, device cpu, dtype bfloat16, sample 0",
        "  argument: weight",
        ("  raw gradient: bfloat16[[]4, 8[]] on cpu, returned by MixedPrecisionLinearBf16WeightGrad's backward; "
         "input: float32[[]4, 8[]] on cpu"),
        "  hint: compute the gradient in the input's dtype*declare it on the marker: grad_casts=(\"weight\",)",
    ], consecutive=True)


def test_grad_metadata_passes_float32_gradients_of_float32_master_weights(pytester, run_pytest):
    run(pytester, run_pytest, MIXED.format(op="MixedPrecisionLinear", extra="")).assert_outcomes(passed=1)


def test_grad_casts_on_the_marker_allows_a_gradient_dtype_that_is_meant(pytester, run_pytest):
    result = run(pytester, run_pytest, MIXED.format(op="MixedPrecisionLinearBf16WeightGrad",
                                                    extra=", grad_casts=('weight', 'bias')"))
    result.assert_outcomes(passed=1)
    result = run(pytester, run_pytest, MIXED.format(op="MixedPrecisionLinearBf16WeightGrad",
                                                    extra=", grad_casts=('bias',)"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["backward returns the gradient of `weight` as bfloat16, but `weight` is float32*"])


def test_grad_casts_must_name_arguments(pytester, run_pytest):
    result = run(pytester, run_pytest, MIXED.format(op="MixedPrecisionLinear", extra=", grad_casts=3"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*grad_casts= takes argument names (e.g. grad_casts=(\"weight\",)) or True, got 3.*"])


def test_grad_metadata_reads_what_a_library_ops_registered_backward_returned(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        @torch.library.custom_op("grad_metadata_test::scale_rows", mutates_args=())
        def scale_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * w

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return grad * w, (grad * x).sum(0).float()  # BUG: float32 for a float64 weight

        scale_rows.register_autograd(backward, setup_context=setup_context)

        @pytest.mark.autograd_op(op=torch.ops.grad_metadata_test.scale_rows)
        def test_scale_rows():
            return [(torch.randn(3, 4), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "backward returns the gradient of `w` as float32, but `w` is float64; autograd casts it silently*",
        "  check grad_metadata, device cpu, dtype float64, sample 0",
        "  argument: w",
        "  raw gradient: float32[[]4[]] on cpu, returned by torch.ops.grad_metadata_test.scale_rows's backward; *",
    ], consecutive=True)


def test_grad_metadata_reads_a_function_inside_a_wrapper(pytester, run_pytest):
    # The op is a plain function calling a Function on a reshaped input: the raw gradient flows into the
    # reshape, an intermediate tensor, and is named by its position among the Function's inputs.
    result = run(pytester, run_pytest, """
        import pytest, torch

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return x * w

            @staticmethod
            def backward(ctx, grad):
                x, w = ctx.saved_tensors
                return (grad * w).float(), grad * x  # BUG: float32 for a float64 input

        def op(x, w):
            return Scale.apply(x.reshape(-1, 4), w)

        @pytest.mark.autograd_op(op=op)
        def test_wrapped():
            return [(torch.randn(2, 3, 4), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "backward returns the gradient of input 0 of Scale as float32, but input 0 of Scale is float64; *",
    ])


def test_grad_metadata_passes_large_float64_ops_whose_backward_only_moves_or_scales_grad_output(pytester, run_pytest):
    # Large cotangents are drawn in float32 and widened: a backward that copies, masks or scales grad_output by a
    # power of two in genuine float64 arithmetic would then return float32 numbers, the fingerprint of a float32
    # backward. Every default check must pass these correct ops at a size past that.
    pytester.makepyfile(textwrap.dedent("""
        import pytest, torch
        from reference_ops import KillHead, MulConstant, MyReLU, SplitHalves

        def large(generator=None):
            return torch.randn(256, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

        @pytest.mark.autograd_op(op=MulConstant, reference=lambda x, c: x * c)
        def test_halve():
            return [(large(), -0.5)]

        @pytest.mark.autograd_op(op=KillHead, reference=lambda x, n: torch.cat([x[..., :n] * 0, x[..., n:]], -1))
        def test_kill_head():
            return [(large(), 3)]

        @pytest.mark.autograd_op(op=MyReLU, reference=torch.relu)
        def test_relu():
            x = large()
            return [(x + x.sign() * 0.1,)]

        @pytest.mark.autograd_op(op=SplitHalves, reference=lambda x, k: (x[..., :k] * 2, x[..., k:] * 3))
        def test_split_halves():
            return [(large(), 100)]
    """))
    result = run_pytest("-rA")
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()
    for test in ("test_halve", "test_kill_head", "test_relu", "test_split_halves"):
        result.stdout.fnmatch_lines([f"PASSED *::{test}[[]grad_metadata-cpu[]]*"])
