"""The aliasing check fails backwards that silently use tensors changed in place after forward."""

import textwrap


def run(pytester, run_pytest, source):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=aliasing")


def test_aliasing_fails_a_detached_output_kept_on_ctx(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ExpKeepsDetachedOutput

        @pytest.mark.autograd_op(op=ExpKeepsDetachedOutput)
        def test_exp():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward silently used values changed in place after forward: the gradient w.r.t. `x` changes when the "
        "caller modifies the op's output `output` in place",
        "*check aliasing, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*worst element: grad x[[]*[]]: expected *, got *",
        "*multiplied the op's output `output` in place by -2*torch's version counter did not object*",
        "*hint: save the tensors backward needs with ctx.save_for_backward(...)*ctx.y = y.detach()*",
    ])


def test_aliasing_names_the_input_whose_alias_escapes_even_beside_a_saved_one(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ScaleKeepsInputAlias

        @pytest.mark.autograd_op(op=ScaleKeepsInputAlias)
        def test_scale():
            return [(torch.randn(3, 4), torch.randn(3, 4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the gradient w.r.t. `x` changes when the caller modifies the op's input `w` in place",
    ])


def test_aliasing_passes_saved_tensors_random_ops_and_in_place_ops(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import AddOneInPlace, LinearFunction, SortWithIndices, SplitHalves
        from reference_ops.state import ExpSavesOutput

        @pytest.mark.autograd_op(op=ExpSavesOutput)
        def test_exp():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_in_place():
            return [(torch.randn(3),)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
        def test_dropout():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=6)


def test_aliasing_takes_torchs_refusal_through_a_view_saved_in_no_grad_mode_as_a_refusal(pytester, run_pytest):
    # x.reshape(-1, n) saved in forward is a view made in no_grad mode: changing x in place afterwards makes
    # backward raise "A view was created in no_grad mode and its base ... has been modified inplace".
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import RowScaleSavesReshapedView

        @pytest.mark.autograd_op(op=RowScaleSavesReshapedView)
        def test_row_scale():
            return [(torch.randn(2, 3, 4), torch.randn(4))]
    """)
    result.assert_outcomes(passed=1)


def test_torchs_in_place_refusals_are_recognised_and_other_errors_are_not():
    import torch

    from pytest_autograd.checks.aliasing import is_refusal

    def base_changed_under_a_no_grad_view():
        x = torch.randn(4, requires_grad=True).clone()
        with torch.no_grad():
            view = x.view(2, 2)
        x.mul_(2)
        view.sum().backward()

    def saved_output_changed():
        y = torch.randn(3, requires_grad=True).exp()
        y.mul_(2)
        y.sum().backward()

    def view_of_a_leaf_changed():
        torch.randn(3, requires_grad=True)[:2].mul_(2)

    errors = []
    for action in (base_changed_under_a_no_grad_view, saved_output_changed, view_of_a_leaf_changed):
        try:
            action()
        except RuntimeError as error:
            errors.append(error)
    assert len(errors) == 3 and all(is_refusal(error) for error in errors), errors
    assert not is_refusal(RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"))
    assert not is_refusal(ValueError("modified by an inplace operation"))
