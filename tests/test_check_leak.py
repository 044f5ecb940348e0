"""The leak check reports what outlives the op's outputs, and inputs kept on ctx past backward."""

import textwrap

import torch


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=leak", *args)


def test_leak_names_the_ctx_attribute_that_closes_a_reference_cycle(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import ReLUSavesOutputOnCtx

        @pytest.mark.autograd_op(op=ReLUSavesOutputOnCtx)
        def test_relu():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*ctx.output holds the op's output: output -> grad_fn (ctx) -> ctx.output -> output is a reference "
        "cycle, so the outputs and the graph outlive their last reference"),
        "*check leak, device cpu, dtype float32, sample 0",
        "*still alive: output, the autograd node ReLUSavesOutputOnCtxBackward (the ctx)",
        "*tensors kept alive: 48 bytes",
        "*gc.collect() frees them: only Python's cyclic garbage collector can",
        ("*hint: save the output with ctx.save_for_backward(...) and read it from ctx.saved_tensors instead of "
         "keeping it in ctx.output*"),
    ])


def test_leak_names_inputs_kept_alive_past_backward_as_ctx_attributes(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearSavesCtxAttributes

        @pytest.mark.autograd_op(op=LinearSavesCtxAttributes)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*ctx.input, ctx.weight, ctx.bias hold the op's inputs `input`, `weight`, `bias` as plain ctx "
        "attributes: they stay alive after backward for as long as the output does"),
        "*kept after backward: 148 bytes (tensor[[]3, 4[]]:float32, tensor[[]5, 4[]]:float32, tensor[[]5[]]:float32)",
        "*no reference cycle: they are freed once the output is dropped",
        "*hint: use ctx.save_for_backward(input, weight, bias) and ctx.saved_tensors*",
    ])


def test_leak_reports_outputs_a_global_cache_keeps_alive_even_after_gc(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        SEEN = []

        def remembering_double(x):
            out = x * 2
            SEEN.append(out)
            return out

        @pytest.mark.autograd_op(op=remembering_double)
        def test_double():
            return [(torch.randn(4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output outlives the last reference to the outputs",
        "*still alive even after gc.collect(): output (something outside the graph*",
    ])


def test_leak_passes_ops_that_use_save_for_backward_and_warns_about_intermediates_on_ctx(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import AddOneInPlace, LinearFunction, MulConstant, MyReLU, SortWithIndices, SplitHalves

        class MaskOnCtx(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.mask = x > 0          # an intermediate: allowed, but held until the output dies
                return x.clamp(min=0)

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.mask

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]

        @pytest.mark.autograd_op(op=MyReLU)
        def test_relu():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=MulConstant)
        def test_mul_constant():
            return [(torch.randn(3, 4), 2.5)]

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_add_one():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        @pytest.mark.autograd_op(op=MaskOnCtx)
        def test_mask_on_ctx():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines([
        ("*HygieneWarning: MaskOnCtx: ctx.mask (tensor[[]3, 4[]]:bool, 12 bytes) stays alive after backward "
        "until the output is dropped*"),
    ])


def test_leak_does_not_blame_inputs_that_a_complex_output_keeps_while_backward_never_ran(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.complex)
        def test_complex():
            return [(torch.randn(3), torch.randn(3))]
    """)
    result.assert_outcomes(passed=1)


TABLE = torch.linspace(0.5, 1.5, 8)  # a cache every call shares


class ScaleByTable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table):
        ctx.table = table
        return x * table

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.table, None


class ScaleKeepsItsOutput(ScaleByTable):
    """BUG: ctx.output = output closes a reference cycle."""

    @staticmethod
    def forward(ctx, x, table):
        ctx.table = table
        output = x * table
        ctx.output = output
        return output


def test_a_wrapper_handing_its_function_a_shared_cache_passes_and_one_keeping_its_output_on_ctx_fails():
    from pytest_autograd.engine.api import run_checks

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    (right,) = run_checks(lambda x: ScaleByTable.apply(x, TABLE), x, checks=["leak"], shrink=0)
    assert right.status == "passed", right.detail
    (wrong,) = run_checks(lambda x: ScaleKeepsItsOutput.apply(x, TABLE), x, checks=["leak"], shrink=0)
    assert wrong.status == "failed", wrong.detail
    assert "ctx.output" in wrong.detail
