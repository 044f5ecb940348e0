"""The noncontiguous check lays out arguments and grad_output differently and names the one that breaks the op."""

import textwrap

import pytest
import torch


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=noncontiguous", *args)


def test_noncontiguous_names_the_transposed_input_that_breaks_the_weight_gradient(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearContiguousAssumption

        @pytest.mark.autograd_op(op=LinearContiguousAssumption)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient w.r.t. `weight` differs from the contiguous run when `input` is transposed",
        "*check noncontiguous, device cpu, dtype float32, sample 0",
        "*argument: weight",
        "*worst element: grad weight[[]*[]]: expected *, got *",
        "*layout: transposed (dims reversed, not contiguous)",
        "*hint: the kernel reads memory as if the tensor were contiguous: call .contiguous()*",
    ])


def test_noncontiguous_blames_grad_output_when_backward_reads_it_as_contiguous(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class ScaleReadsGradOutputRaw(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                # walks grad's memory the way a raw kernel on data_ptr() would
                raw = grad.as_strided(grad.shape, torch.empty(grad.shape).stride())
                return raw * 2

        @pytest.mark.autograd_op(op=ScaleReadsGradOutputRaw)
        def test_scale():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient w.r.t. `x` differs from the contiguous run when grad_output is transposed",
    ])


def test_noncontiguous_reports_an_out_of_bounds_read_of_an_expanded_input(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class RowSums(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                if x.stride(-1) != 1 or x.stride(0) > x.shape[1]:   # assumes a row stride of at least the width
                    x = x.contiguous()
                ctx.width = x.shape[-1]
                rows = x.as_strided((x.shape[0], x.shape[1]), (x.shape[1], 1))
                return rows.sum(-1)

            @staticmethod
            def backward(ctx, grad):
                return grad.unsqueeze(-1).expand(grad.shape[0], ctx.width).clone()

        @pytest.mark.autograd_op(op=RowSums)
        def test_row_sums():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's forward raised RuntimeError when `x` is expanded: setStorage: *out of bounds*",
        "*layout: expanded (stride 0 along the leading dim)",
    ])


GRAD_OUTPUT_READ = """
import pytest, torch

class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        {read}
        return grad * 2

@pytest.mark.autograd_op(op=Scale)
def test_scale():
    return [(torch.randn({shape}),)]
"""


def test_noncontiguous_catches_a_backward_that_checks_only_the_innermost_stride_of_grad_output(pytester, run_pytest):
    # Right for contiguous and transposed cotangents; wrong for the row-strided one torch.cat([y, z], -1) gives.
    result = run(pytester, run_pytest, GRAD_OUTPUT_READ.format(shape="3, 4", read="""
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        grad = grad.as_strided(grad.shape, (grad.shape[-1], 1))  # a kernel indexing row * n_cols"""))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` differs from the contiguous run when grad_output is row-strided",
        "  check noncontiguous, device cpu, dtype float32, sample 0",
        "  argument: x",
        "  worst element: grad x[[]*[]]: expected *, got *",
        "  max abs error *",
        "  layout: row-strided (last stride 1, rows twice their width apart, as after torch.cat, split, chunk or "
        "narrow along the last dim)",
    ], consecutive=True)


def test_noncontiguous_catches_a_backward_that_ignores_the_storage_offset_of_grad_output(pytester, run_pytest):
    # A kernel handed the storage's start instead of data_ptr(): right until grad_output is a chunk of a buffer.
    result = run(pytester, run_pytest, GRAD_OUTPUT_READ.format(shape="3, 4", read="""
        grad = grad.contiguous()
        grad = torch.empty(0, dtype=grad.dtype).set_(grad.untyped_storage(), 0, grad.shape, grad.stride())"""))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` differs from the contiguous run when grad_output is at a storage offset",
        "*layout: at storage offset 2 (contiguous otherwise, as a chunk along dim 0 is)",
    ])


def test_noncontiguous_catches_a_backward_that_flattens_rows_with_the_second_last_stride(pytester, run_pytest):
    # Last stride 1 and rows at least a width apart is all it checks: a batch/sequence transpose breaks it.
    result = run(pytester, run_pytest, GRAD_OUTPUT_READ.format(shape="2, 3, 4", read="""
        if grad.stride(-1) != 1 or grad.stride(-2) < grad.shape[-1]:
            grad = grad.contiguous()
        grad = grad.as_strided(grad.shape, (grad.shape[1] * grad.stride(-2), grad.stride(-2), 1))"""))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*when grad_output is permuted*",
                                 "*layout: permuted (two leading dims swapped in memory, the last dim still innermost)"])


def test_noncontiguous_hands_backward_the_broadcast_gradient_of_a_sum(pytester, run_pytest):
    # loss = y.sum() gives backward one value with every stride 0: writing into it in place is refused.
    result = run(pytester, run_pytest, GRAD_OUTPUT_READ.format(shape="3, 4", read="""
        grad = grad.mul_(1)  # in place into grad_output, as a kernel writing its result there would"""))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's backward raised RuntimeError when grad_output is broadcast: *",
        "*layout: broadcast (every stride 0, one value everywhere, as the backward of .sum() or .mean() gives)",
    ])


def test_noncontiguous_catches_a_triton_backward_checking_only_the_innermost_stride(pytester, run_pytest):
    from pytest_autograd.engine.triton_interpreter import interpreter_on

    device = "cpu" if interpreter_on() else "cuda"  # the interpreter runs Triton on CPU tensors, else the GPU does
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1 set before triton is imported")
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.triton_layer_norm import TritonLayerNormInnerStrideOnly, layer_norm_bf16_samples

        @pytest.mark.autograd_op(op=TritonLayerNormInnerStrideOnly)
        def test_layer_norm():
            return layer_norm_bf16_samples(torch.Generator().manual_seed(0))[:1]
    """, f"--autograd-devices={device}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` differs from the contiguous run when grad_output is row-strided",
        f"  check noncontiguous, device {device}, dtype bfloat16, sample 0",
    ])


def test_noncontiguous_passes_ops_that_handle_every_layout(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        import torch.nn.functional as F
        from reference_ops import AddOneInPlace, LinearFunction, SortWithIndices, SplitHalves, KillHead

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
            return [(x, w, b), (torch.randn(2, 3, 4), w, None)]

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_in_place_with_mark_dirty():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=KillHead)
        def test_kill_head():
            return [(torch.randn(2, 3, 4), 1)]

        def conv(x, w):
            return F.conv2d(x, w, padding=1)

        @pytest.mark.autograd_op(op=conv)
        def test_conv_channels_last():
            return [(torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3))]
    """)
    result.assert_outcomes(passed=6)


def test_noncontiguous_layouts_keep_values_and_break_contiguity():
    from pytest_autograd.checks.noncontiguous import (
        channels_last,
        offset,
        permuted,
        row_strided,
        sliced,
        transposed,
    )

    x = torch.randn(2, 3, 4, 5)
    for layout in (transposed, sliced, channels_last, row_strided, permuted):
        laid = layout(x)
        assert not laid.is_contiguous() and torch.equal(laid, x)
    laid = row_strided(x)
    assert laid.stride(-1) == 1 and laid.stride(-2) == 2 * x.shape[-1]
    laid = permuted(x)
    assert laid.stride(-1) == 1 and laid.stride(0) < laid.stride(1)
    laid = offset(x)
    assert laid.is_contiguous() and laid.storage_offset() > 0 and torch.equal(laid, x)
    assert channels_last(torch.randn(3, 4)) is None
    assert transposed(torch.randn(5)) is None
    assert sliced(torch.randn(1, 1)) is None
    assert row_strided(torch.randn(1, 4)) is None and permuted(torch.randn(3, 4)) is None


def test_noncontiguous_passes_an_in_place_function_with_two_outputs_as_layouts_are_not_views(pytester, run_pytest):
    # autograd forbids a Function that modifies a *view* in place from returning two outputs; the
    # layouts change strides only, so this correct op must pass.
    result = run(pytester, run_pytest, """
        import pytest, torch
        from torch.autograd import Function

        class AddOneAndSum(Function):
            @staticmethod
            def forward(ctx, x):
                x.add_(1)
                ctx.mark_dirty(x)
                return x, x.sum()

            @staticmethod
            def backward(ctx, grad_x, grad_sum):
                return grad_x + grad_sum

        @pytest.mark.autograd_op(op=AddOneAndSum)
        def test_add_one_and_sum():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=1)


def test_noncontiguous_layouts_own_their_storage_and_pass_gradients_back():
    from pytest_autograd.checks.noncontiguous import offset, row_strided, sliced, transposed

    x = torch.randn(3, 4, requires_grad=True)
    for layout in (transposed, sliced, row_strided, offset):
        laid = layout(x)
        assert laid._base is None and (not laid.is_contiguous() or laid.storage_offset())
        (laid * 2).sum().backward()
        assert torch.equal(x.grad, torch.full((3, 4), 2.0))
        x.grad = None


def test_batch_norm_at_the_equal_rows_an_expanded_layout_makes_passes_every_default_check(pytester, run_pytest):
    """Equal rows make the variance 0: float32 layouts differ by rounding, float64 ones agree; noted, not failed."""
    pytester.makepyfile(test_ops="""
        import pytest
        from reference_ops.normalization import MARKER_OPTIONS, batch_norm_samples, batch_norm_train

        @pytest.mark.autograd_op(op=batch_norm_train, **MARKER_OPTIONS)
        def test_batch_norm():
            return batch_norm_samples()
    """)
    result = run_pytest("-rA")
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and outcomes["passed"] >= 10
    result.stdout.fnmatch_lines(["*noncontiguous: the expanded layout makes the values along the leading dim equal*"])


def test_a_kernel_assuming_contiguous_memory_still_fails_in_float32(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
        import pytest, torch
        from reference_ops.buggy import LinearContiguousAssumption

        @pytest.mark.autograd_op(op=LinearContiguousAssumption, checks=["noncontiguous"])
        def test_linear():
            return [(torch.randn(5, 4), torch.randn(3, 4), torch.randn(3))]
    """)
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*differs from the contiguous run when*"])
