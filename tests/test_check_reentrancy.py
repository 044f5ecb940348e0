"""The reentrancy check fails state shared between calls, seen only when two calls are interleaved."""

import textwrap


def run(pytester, run_pytest, source):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=reentrancy")


def test_reentrancy_names_the_gradient_an_input_stashed_on_the_class_corrupts(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import SquareStashesInputOnClass

        @pytest.mark.autograd_op(op=SquareStashesInputOnClass)
        def test_square():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*interleaved calls change the results: the gradient w.r.t. `x` of the first call differs from the same "
        "call run alone",
        "*check reentrancy, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*interleaved: y1 = op(sample 0); y2 = op(sample 0 scaled by 0.75); backward(y1); backward(y2)*",
        "*hint: keep per-call state on ctx*never on the Function class or a module global*",
    ])


def test_reentrancy_fails_a_gradient_buffer_that_is_never_zeroed(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import SquareAccumulatesGradBuffer

        @pytest.mark.autograd_op(op=SquareAccumulatesGradBuffer)
        def test_square():
            return [(torch.randn(3, 4),), (torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*interleaved calls change the results: the gradient w.r.t. `x` of the first call differs*",
        "*interleaved: y1 = op(sample 0); y2 = op(sample 1); backward(y1); backward(y2)*",
    ])


def test_reentrancy_reports_a_backward_that_raises_only_when_calls_interleave(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import SquareStashesInputOnClass

        @pytest.mark.autograd_op(op=SquareStashesInputOnClass)
        def test_square():
            return [(torch.randn(3, 4),), (torch.randn(5),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's backward raised RuntimeError only when two calls are interleaved: The size of tensor*",
        "*hint: keep per-call state on ctx*",
    ])


def test_reentrancy_passes_ops_that_keep_state_on_ctx_or_draw_random_numbers(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import SquareSavesOnCtx, WindowedScale

        @pytest.mark.autograd_op(op=SquareSavesOnCtx)
        def test_square():
            return [(torch.randn(3, 4),), (torch.randn(5),)]

        @pytest.mark.autograd_op(op=WindowedScale)
        def test_windowed_scale():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
        def test_dropout():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=3)
