"""The requires_grad check runs backward with every subset of inputs requiring grad and names the one that breaks."""

import textwrap


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=requires_grad", *args)


def test_requires_grad_names_the_subset_where_backward_drops_a_gradient(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearNeedsInputGradMisuse

        @pytest.mark.autograd_op(op=LinearNeedsInputGradMisuse)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient w.r.t. `weight` is wrong when only `weight` requires grad",
        "*check requires_grad, device cpu, dtype float32, sample 0",
        "*argument: weight",
        "*worst element: grad weight[[]*[]]: expected *, got 0",
        "*requiring grad: weight; not requiring grad: input, bias",
        ("*hint: backward returned no gradient for `weight` although it requires grad; gate each gradient on "
        "its own flag, ctx.needs_input_grad[[]i[]]*"),
    ])


def test_requires_grad_reports_a_backward_that_crashes_when_an_input_needs_no_grad(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class MulCrashesWithoutBothGrads(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a * b

            @staticmethod
            def backward(ctx, grad):
                a, b = ctx.saved_tensors
                grad_a = grad * b if ctx.needs_input_grad[0] else None
                grad_b = grad * a if ctx.needs_input_grad[1] else None
                return grad_a * 1, grad_b * 1   # assumes both were computed

        @pytest.mark.autograd_op(op=MulCrashesWithoutBothGrads)
        def test_mul():
            return [(torch.randn(4), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's backward raised TypeError when only `a` requires grad: unsupported operand type(s) for *",
        "*requiring grad: a; not requiring grad: b",
        "*at *test_requires_grad_reports_a_backward_that_crashes_when_an_input_needs_no_grad.py:* in backward",
    ])


def test_requires_grad_passes_ops_that_honour_needs_input_grad_and_skips_single_input_ops(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import LinearFunction, LinearFunctionSetupContext, MyReLU, RNNCell, rnn_cell_samples

        class MulReturnsEveryGrad(torch.autograd.Function):
            # returns gradients even for inputs that need none: autograd drops them
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a * b

            @staticmethod
            def backward(ctx, grad):
                a, b = ctx.saved_tensors
                return grad * b, grad * a

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
            return [(x, w, b), (x, w, None)]

        @pytest.mark.autograd_op(op=LinearFunctionSetupContext)
        def test_linear_setup_context():
            return [(torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5))]

        @pytest.mark.autograd_op(op=RNNCell)
        def test_rnn_cell_six_inputs_covering_subsets():
            return rnn_cell_samples(torch.Generator().manual_seed(0))

        @pytest.mark.autograd_op(op=MulReturnsEveryGrad)
        def test_mul():
            return [(torch.randn(4), torch.randn(4))]

        @pytest.mark.autograd_op(op=MyReLU)
        def test_relu():
            return [(torch.randn(4),)]
    """, "-rs")
    result.assert_outcomes(passed=5)  # the one-input ReLU is judged on its inference path


def test_requires_grad_tries_all_subsets_of_few_inputs_and_a_covering_set_of_many():
    from pytest_autograd.checks.requires_grad import subsets

    assert len(subsets(3)) == 7  # every proper subset, the empty one included
    many = subsets(6)
    assert () in many and all((i,) in many for i in range(6))
    assert all(tuple(j for j in range(6) if j != i) in many for i in range(6))
    assert (1, 2) in many and len(many) < 2 ** 6 - 1


def test_a_one_input_op_with_another_formula_when_nothing_requires_grad_fails_on_its_inference_path(
        pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import math
        import pytest, torch

        class GeluTanhAtInference(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if not x.requires_grad:  # BUG: the inference path takes the tanh approximation
                    return torch.nn.functional.gelu(x, approximate="tanh")
                ctx.save_for_backward(x)
                return torch.nn.functional.gelu(x)

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
                return grad * (cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))

        @pytest.mark.autograd_op(op=GeluTanhAtInference)
        def test_gelu():
            return [(torch.randn(64) * 3,)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["output changes when no input requires grad"])
