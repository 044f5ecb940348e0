"""The undefined_grad check leaves outputs unused so their gradients are undefined, and names which one."""

import textwrap

SPLIT_WITHOUT_NONE_HANDLING = """
import pytest, torch

class SplitHalvesNoNoneHandling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.set_materialize_grads(False)
        ctx.k = k
        return x[..., :k] * 2, x[..., k:] * 3

    @staticmethod
    def backward(ctx, grad_head, grad_tail):
        return torch.cat([grad_head * 2, grad_tail * 3], dim=-1), None

@pytest.mark.autograd_op(op=SplitHalvesNoNoneHandling)
def test_split():
    return [(torch.randn(3, 5), 2)]
"""


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=undefined_grad", *args)


def test_undefined_grad_says_which_output_was_left_unused(pytester, run_pytest):
    result = run(pytester, run_pytest, SPLIT_WITHOUT_NONE_HANDLING)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*the op's backward raised TypeError when only output 0 is used (output 1 left unused, its gradient "
        "undefined): unsupported operand type(s) for *: 'NoneType' and 'int'"),
        "*check undefined_grad, device cpu, dtype float32, sample 0",
        "*output: output 1",
        ("*hint: with ctx.set_materialize_grads(False), backward receives None for every output whose gradient "
        "is undefined*"),
    ])


def test_undefined_grad_fails_a_single_output_op_that_cannot_take_none(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import MulConstantNoNoneHandling

        @pytest.mark.autograd_op(op=MulConstantNoNoneHandling)
        def test_mul_constant():
            return [(torch.randn(3, 4), 2.5)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*the op's backward raised TypeError when the gradient of output is undefined: "
        "unsupported operand type(s) for *: 'NoneType' and 'float'"),
        "*at *reference_ops/buggy.py:* in backward",
    ])


def test_undefined_grad_fails_a_backward_that_returns_a_gradient_for_nothing(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class ShiftedGrad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2 + 1e-3   # non-zero even when grad is zero

        @pytest.mark.autograd_op(op=ShiftedGrad)
        def test_shifted():
            return [(torch.randn(4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward returns a non-zero gradient for `x` when the gradient of output is undefined",
    ])


def test_undefined_grad_passes_ops_that_handle_none_and_integer_outputs(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import MulConstant, SortWithIndices, SplitHalves, LinearFunction

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2), (torch.randn(4), 1)]

        @pytest.mark.autograd_op(op=MulConstant)
        def test_mul_constant():
            return [(torch.randn(3, 4), 2.5)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), None)]

        def three_parts(x):
            return x[:2] * 2, x[2:4].sin(), x[4:].exp()

        @pytest.mark.autograd_op(op=three_parts)
        def test_three_outputs_each_left_out():
            return [(torch.randn(6),)]
    """)
    result.assert_outcomes(passed=5)
