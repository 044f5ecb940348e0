"""gradcheck catches wrong first derivatives, small inputs by full Jacobian, large ones by probes."""

import torch

HEADER = """
import pytest
import torch
from reference_ops import Cube, LinearFunction, MyReLU, RNNCell, rnn_cell_samples
from reference_ops.buggy import (
    CubeWrongAtOneElement,
    LinearGradInputWrong,
    LinearWeightGradTransposed,
    ReLUPositiveGradOnly,
    RNNCellMissingTanhDerivative,
)

def linear_samples():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)), (torch.randn(2, 4), torch.randn(5, 4), None)]

def relu_samples():
    return [(torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]]),)]
"""


def marked(op, samples):
    return HEADER + f"""
@pytest.mark.autograd_op(op={op})
def test_op():
    return {samples}
"""


def run_gradcheck(pytester, run_pytest, op, samples, *args):
    pytester.makepyfile(test_ops=marked(op, samples))
    return run_pytest("--autograd-checks=gradcheck", *args)


def test_transposed_weight_gradient_fails_naming_weight(pytester, run_pytest):
    result = run_gradcheck(pytester, run_pytest, "LinearWeightGradTransposed", "linear_samples()")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `weight` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: output, argument: weight",
        "  worst element: d output[[]*] / d weight[[]*]: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (full Jacobian)",
    ], consecutive=True)


def test_input_gradient_missing_a_term_fails_naming_input(pytester, run_pytest):
    result = run_gradcheck(pytester, run_pytest, "LinearGradInputWrong", "linear_samples()")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `input` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: output, argument: input",
        "  worst element: d output[[]*, 4] / d input[[]*]: expected * (numerical), got 0 (analytical)",
    ], consecutive=True)


def test_correct_linear_passes(pytester, run_pytest):
    run_gradcheck(pytester, run_pytest, "LinearFunction", "linear_samples()").assert_outcomes(passed=1)


def test_rnn_cell_missing_tanh_derivative_fails(pytester, run_pytest):
    result = run_gradcheck(pytester, run_pytest, "RNNCellMissingTanhDerivative", "rnn_cell_samples()")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `*` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  worst element: d output[[]*] / d *: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (full Jacobian)",
    ])
    argument = result.stdout.str().split("w.r.t. `")[1].split("`")[0]
    assert argument in {"x", "h", "w_ih", "w_hh", "b_ih", "b_hh"}


def test_correct_rnn_cell_passes(pytester, run_pytest):
    run_gradcheck(pytester, run_pytest, "RNNCell", "rnn_cell_samples()").assert_outcomes(passed=1)


def test_backward_right_only_for_positive_grad_outputs_fails_on_the_sign_mixed_cotangent(pytester, run_pytest):
    # The one-hot cotangents that build the Jacobian are all positive, so the
    # Jacobian matches; only the random sign-mixed cotangent exposes the clamp.
    result = run_gradcheck(pytester, run_pytest, "ReLUPositiveGradOnly", "relu_samples()")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: all outputs, argument: x",
        "  worst element: grad x[[]*]: expected -* (numerical), got 0 (analytical)",
        "  abs error * > tolerance * (random sign-mixed cotangent; the Jacobian itself matched, so backward is "
        "not linear in grad_output (e.g. right only for positive grad_outputs))",
        "  hint: backward treats grad_output non-linearly (abs, clamp, sign): gradients must scale with "
        "grad_output, including negative values",
    ], consecutive=True)


def test_positive_grad_only_is_caught_when_the_sample_comes_from_the_seeded_rng(pytester, run_pytest):
    # Regression: the check's cotangent used to replay the RNG stream the body
    # drew x from, so it was negative exactly where the ReLU gradient is zero.
    result = run_gradcheck(pytester, run_pytest, "ReLUPositiveGradOnly", "[(torch.randn(3, 4),)]")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of all outputs w.r.t. `x` does not match the numerical derivative"])


def test_the_checks_random_stream_differs_from_the_bodys():
    from pytest_autograd.engine.case import Sample, build_case
    from pytest_autograd.checks.base import CheckContext
    from pytest_autograd.engine.execution import random_cotangents

    torch.manual_seed(1234)
    x = torch.randn(3, 4, dtype=torch.float64)
    context = CheckContext("gradcheck", build_case({"op": torch.relu}, [Sample(x)]), "cpu", 1234)
    [cotangent] = random_cotangents([x], context.generator)
    assert not torch.allclose(cotangent, x)


def test_correct_relu_passes(pytester, run_pytest):
    run_gradcheck(pytester, run_pytest, "MyReLU", "relu_samples()").assert_outcomes(passed=1)


def test_one_wrong_element_of_a_large_input_is_found_by_probing(pytester, run_pytest):
    # 64 x 32 = 2048 elements: above the full-Jacobian limit, so whole-input random
    # directions are used, and group testing names the one wrong element.
    result = run_gradcheck(pytester, run_pytest, "CubeWrongAtOneElement", "[(torch.randn(64, 32),)]")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: all outputs, argument: x",
        "  worst element: grad x[[]63, 31[]]: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (3 random directions over all 2048 elements; element located in * more probes, "
        "tolerance atol + rtol * |numerical| + 8 x its measured finite-difference error)",
        "  hint: only grad x[[]63, 31[]] is wrong: it fails alone, and a random direction over the other 2047 "
        "elements of `x` matches: an indexing or boundary slip (the last element, a tile's edge, a loop bound), not "
        "the formula",
    ], consecutive=True)
    assert "constant factor" not in result.stdout.str()  # twice the numerical value at that element only


def test_torch_fast_mode_gradcheck_misses_the_same_one_element_bug():
    """Documented contrast: a single random projection rarely weighs the wrong element enough."""
    from reference_ops.buggy import CubeWrongAtOneElement

    generator = torch.Generator().manual_seed(0)
    missed = 0
    for _ in range(5):
        x = torch.randn(64, 32, generator=generator, dtype=torch.float64).requires_grad_()
        missed += torch.autograd.gradcheck(CubeWrongAtOneElement.apply, (x,), fast_mode=True, raise_exception=False)
    assert missed >= 4
    x = torch.randn(4, 4, generator=generator, dtype=torch.float64).requires_grad_()
    assert not torch.autograd.gradcheck(CubeWrongAtOneElement.apply, (x,), raise_exception=False)


def test_correct_cube_on_a_large_input_passes(pytester, run_pytest):
    run_gradcheck(pytester, run_pytest, "Cube", "[(torch.randn(64, 32),)]").assert_outcomes(passed=1)


LAST_ROW = """
import pytest
import torch

class ScaleRows(torch.autograd.Function):
    \"\"\"x * 1.5; with wrong=True the gradient of the last row is 1.6 instead.\"\"\"

    @staticmethod
    def forward(ctx, x, wrong):
        ctx.wrong = wrong
        return x * 1.5

    @staticmethod
    def backward(ctx, grad):
        grad_x = grad * 1.5
        if ctx.wrong:
            grad_x = torch.cat([grad_x[:-1], grad[-1:] * 1.6])
        return grad_x, None

@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
@pytest.mark.autograd_op(op=ScaleRows)
def test_scale_rows(wrong):
    return [(torch.randn(256, 320), wrong)]
"""


def test_an_error_confined_to_the_last_row_of_a_256_by_320_input_is_caught(pytester, run_pytest):
    pytester.makepyfile(test_rows=LAST_ROW)
    result = run_pytest("--autograd-checks=gradcheck", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_scale_rows[[]gradcheck-cpu-right[]] PASSED*",
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: all outputs, argument: x",
        "  worst element: grad x[[]255*",
    ])


def test_samples_without_floating_tensors_are_skipped(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.autograd_op(op=torch.bitwise_not)
        def test_integers():
            return [(torch.arange(4),)]
        """
    )
    result = run_pytest("--autograd-checks=gradcheck", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no floating-point tensor argument to differentiate"])


def test_marker_tolerances_are_used(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch

        class SlightlyOff(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2.01

        @pytest.mark.autograd_op(op=SlightlyOff)
        def test_strict():
            return [(torch.ones(3),)]

        @pytest.mark.autograd_op(op=SlightlyOff, atol=0.1, rtol=0.0)
        def test_loose():
            return [(torch.ones(3),)]
        """
    )
    result = run_pytest("--autograd-checks=gradcheck", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_strict[[]gradcheck-cpu[]] FAILED*", "*test_loose[[]gradcheck-cpu[]] PASSED*"])


def test_channels_last_inputs_and_transposed_outputs_are_checked_without_crashing(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest
import torch
import torch.nn.functional as F

@pytest.mark.autograd_op(op=F.conv2d)
def test_conv():
    return [(torch.randn(1, 2, 4, 4).to(memory_format=torch.channels_last), torch.randn(3, 2, 3, 3))]

@pytest.mark.autograd_op(op=torch.transpose)
def test_transpose():
    return [(torch.randn(3, 4), 0, 1)]
""")
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=4)


def test_an_op_computing_in_float32_for_float64_inputs_is_judged_in_float32_saying_how(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest
import torch

def float32_only(x):
    return x.float().sin()

@pytest.mark.autograd_op(op=float32_only)
def test_op():
    return [(torch.randn(3, 4),)]
""")
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*AutogradNote: gradcheck: the op returns float32 outputs for float64 inputs; judged by central "
        "differences in float32 at three step sizes*",
    ])
