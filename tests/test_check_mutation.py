"""The mutation check fails ops that write into their inputs or grad_output, and passes declared in-place ops."""

import textwrap


def run(pytester, run_pytest, source):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=mutation")


def test_mutation_names_the_argument_forward_changes_without_mark_dirty(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import AddOneInPlaceNoMarkDirty

        @pytest.mark.autograd_op(op=AddOneInPlaceNoMarkDirty)
        def test_add_one():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `x` in place without declaring it: 12 of 12 elements changed",
        "*check mutation, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*worst element: x[[]0, 0[]]: before *, after *",
        "*hint: work on a copy (`x = x.clone()`), or declare the in-place update with ctx.mark_dirty(x)*",
    ])


def test_mutation_fails_a_backward_that_scales_grad_output_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import ScaleMutatesGradOutput

        @pytest.mark.autograd_op(op=ScaleMutatesGradOutput)
        def test_scale():
            return [(torch.randn(5),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward modified its incoming gradient `grad_output` in place: 5 of 5 elements changed",
        "*argument: grad_output",
        "*hint: compute a new tensor (`grad_output * 2`) instead of updating it in place*",
    ])


def test_mutation_names_an_input_a_plain_function_overwrites_and_does_not_return(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        def scaled_copy(x, scratch):
            scratch[:2] = x[:2]   # writes the caller's buffer, returns something else
            return x * 2

        @pytest.mark.autograd_op(op=scaled_copy)
        def test_scaled_copy():
            return [(torch.randn(4), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `scratch` in place without declaring it: 2 of 4 elements changed",
    ])


def test_mutation_passes_declared_in_place_ops_and_clean_backwards(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import AddOneInPlace, ScaleOnceDifferentiable, SplitHalves, SortWithIndices

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_add_one_with_mark_dirty():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=ScaleOnceDifferentiable)
        def test_scale():
            return [(torch.randn(5),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        def add_in_place(x, y):
            return x.add_(y)   # returns the tensor it changed: the caller sees the change

        @pytest.mark.autograd_op(op=add_in_place)
        def test_plain_in_place_returning_its_input():
            return [(torch.randn(3), torch.randn(3))]
    """)
    result.assert_outcomes(passed=5)
