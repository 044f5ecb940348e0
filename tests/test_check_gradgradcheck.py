"""gradgradcheck: the backward itself must be differentiable, and its derivative right."""

HEADER = """
import pytest
import torch
from reference_ops import Cube, LinearFunction, RNNCell, ScaleOnceDifferentiable, rnn_cell_samples
from reference_ops.buggy import CubeNotDifferentiableBackward

class CubeHalfSecondDerivative(torch.autograd.Function):
    \"\"\"First derivative right (3x^2), but written 3 * x * x.detach(): its derivative is 3x, not 6x.\"\"\"

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x.detach()

class CubeDetachedBackward(torch.autograd.Function):
    \"\"\"Backward computed entirely on detached tensors: nothing in it requires grad.\"\"\"

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.detach() * 3 * x.detach() ** 2
"""


def marked(op, samples="[(torch.randn(3, 4),), (torch.randn(5),)]", extra=""):
    return HEADER + f"""
@pytest.mark.autograd_op(op={op}{extra})
def test_op():
    return {samples}
"""


def run_gradgradcheck(pytester, run_pytest, op, *args, **kwargs):
    pytester.makepyfile(test_ops=marked(op, **kwargs))
    return run_pytest("--autograd-checks=gradgradcheck", "-rs", *args)


def test_a_backward_using_detached_inputs_is_reported_as_not_differentiable(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "CubeNotDifferentiableBackward")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "backward is not differentiable w.r.t. `x`: the analytical second derivative is all zeros while the "
        "numerical one is not",
        "  check gradgradcheck, device cpu, dtype float64, sample 0",
        "  output: grad x, argument: x",
        "  worst element: * expected * (numerical), got 0 (analytical)",
        "  abs error * > tolerance * (full Jacobian)",
        "  hint: backward is not differentiable w.r.t. `x`: it likely uses detached tensors (.detach(), .data, "
        ".item(), numpy) or a kernel without autograd support. Write backward with differentiable torch ops, "
        "or declare it with @once_differentiable / double_backward=False on the marker",
    ], consecutive=True)
    assert "does not match" not in result.stdout.str()


def test_a_fully_detached_backward_says_its_results_do_not_require_grad(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "CubeDetachedBackward")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "backward is not differentiable: its results do not require grad, so every second derivative is zero",
        "  check gradgradcheck, device cpu, dtype float64, sample 0",
    ], consecutive=True)


def test_a_wrong_second_derivative_is_a_mismatch_naming_the_gradient_and_argument(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "CubeHalfSecondDerivative")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "second derivative of grad x w.r.t. `x` does not match the numerical one",
        "  check gradgradcheck, device cpu, dtype float64, sample 0",
        "  output: grad x, argument: x",
        "  worst element: d grad x[[]*] / d x[[]*]: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (full Jacobian)",
        "  hint: the backward's own gradient is wrong: check the ops backward uses on saved tensors",
    ], consecutive=True)


def test_the_correct_cube_passes(pytester, run_pytest):
    run_gradgradcheck(pytester, run_pytest, "Cube").assert_outcomes(passed=1)


def test_correct_linear_and_rnn_cell_pass(pytester, run_pytest):
    pytester.makepyfile(
        test_ops=HEADER + """
@pytest.mark.autograd_op(op=LinearFunction)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)), (torch.randn(3, 4), torch.randn(5, 4), None)]

@pytest.mark.autograd_op(op=RNNCell)
def test_rnn_cell():
    return rnn_cell_samples()
"""
    )
    run_pytest("--autograd-checks=gradgradcheck").assert_outcomes(passed=2)


def test_once_differentiable_backward_is_skipped_with_the_reason(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "ScaleOnceDifferentiable")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED * the op's backward is @once_differentiable: its author declared no second derivative"])


def test_once_differentiable_inside_a_plain_function_op_is_skipped_too(pytester, run_pytest):
    # Not a Function class, so only running the double backward reveals it.
    # torch.autograd.grad never runs the node @once_differentiable leaves in
    # the graph, so without looking for it the second derivative would
    # silently be zero and reported as a wrong double backward.
    result = run_gradgradcheck(pytester, run_pytest, "lambda x: ScaleOnceDifferentiable.apply(x) + x")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED * part of the op's backward is @once_differentiable (its gradient graph holds an Error node): "
        "its author declared no second derivative"])


def test_double_backward_false_on_the_marker_skips_saying_the_marker_declared_it(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "CubeNotDifferentiableBackward", extra=", double_backward=False")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED * double_backward=False on the marker declares that the op has no second derivative"])
    assert "author" not in result.stdout.str()


def test_integer_only_samples_are_skipped(pytester, run_pytest):
    result = run_gradgradcheck(pytester, run_pytest, "torch.neg", samples="[(torch.arange(3),)]")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no floating-point tensor argument to differentiate"])


def test_an_op_computing_in_float32_for_float64_inputs_is_judged_in_float32_not_failed(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest
import torch

def float32_only(x):
    return x.float().sin()

@pytest.mark.autograd_op(op=float32_only)
def test_op():
    return [(torch.randn(3, 4),)]
""")
    result = run_pytest("--autograd-checks=gradgradcheck", "-rs")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*AutogradNote: gradgradcheck: the op returns float32 outputs for float64 inputs; "
                                 "judged by central differences in float32*"])
