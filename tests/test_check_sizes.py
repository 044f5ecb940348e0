"""The sizes check reruns the op at sizes its samples do not have, and names the dim and the size that break it."""

import re
import textwrap
import time

import pytest
import torch

from pytest_autograd import Sample
from pytest_autograd.engine.api import run_checks
from pytest_autograd.engine.outcomes import UsageProblem

HEADER = """
import pytest, torch
from reference_ops.sizes import *
"""


def run(pytester, run_pytest, source, *args, checks="sizes"):
    pytester.makepyfile(test_ops=HEADER + textwrap.dedent(source))
    return run_pytest(f"--autograd-checks={checks}", "-rs", *args)


def sizes_outcome(op, samples, **options):
    (outcome,) = run_checks(op, samples=samples, checks=["sizes"], **options)
    return outcome


# ---------------------------------------------------------------------------
# The bugs it catches, at sizes the power-of-two samples do not have
# ---------------------------------------------------------------------------


def test_a_last_block_read_without_its_mask_fails_at_a_width_that_is_not_a_multiple_of_the_block(
        pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmaxTailReadsNextRow)
        def test_softmax():
            return SAMPLES["softmax"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when dim 1 (size 8 in your sample) is 9",
        "*check sizes, device cpu, dtype float64, sample 0",
        "*argument: x",
        "*worst element: grad x[[]*[]]: expected * (numerical), got * (analytical)",
        "*abs error * > tolerance *",
        "*judged by: the derivative engine in float64 (finite differences)",
        "*sizes judged for this dim: right at 4, 8, 16; wrong at 1, 7, 9, 17",
        "*if the op does not support size 9 by design, make it raise there*sizes={8: None} to keep it fixed",
        "*hint: the wrong sizes are exactly those that are not a multiple of 4 (right at 4, 8, 16; wrong at 1, 7, 9, "
        "17): the last, partial block is mishandled: check its mask*",
        "*rerun: *test_ops.py::test_softmax*sizes-cpu*",
    ])


def test_a_backward_grid_with_floor_division_fails_at_a_row_count_the_program_size_does_not_divide(
        pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmaxGridFloor, reference=softmax_reference)
        def test_softmax():
            return SAMPLES["softmax"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when dim 0 (size 4 in your sample) is 5",
        "*worst element: grad x[[]4, *[]]: expected *, got 0",
        "*judged by: outputs and gradients in float64 against the reference's (same cotangent)",
        "*hint: the wrong sizes are exactly those that are not a multiple of 2 *that the grid covers it "
        "(triton.cdiv(n, BLOCK), not n // BLOCK)",
    ])


def test_a_split_boundary_counted_twice_fails_once_the_reduction_spans_two_splits(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=SplitKMatmulInclusiveEnd, reference=matmul_reference)
        def test_matmul():
            return SAMPLES["matmul"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output is wrong when dim 1 of `x` (size 8 in your sample) is 9",
        "*output: output",
        "*changed together: dim 1 of `x`, dim 1 of `weight`",
        "*hint: sizes up to 8 are right and every larger one is wrong (right at 1, 4, 7, 8; wrong at 9, 16, 17): "
        "the op is right only while the dim fits in one block or split*",
    ])


def test_a_split_boundary_bug_is_caught_by_finite_differences_without_a_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=SplitKMatmulInclusiveEnd)
        def test_matmul():
            return SAMPLES["matmul"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `*` is wrong when dim 1 (size 8 in your sample) is 9"])


def test_a_batch_of_one_squeezed_away_fails_only_at_size_one(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=BatchCenteredSqueeze, reference=batch_centered_reference)
        def test_centered():
            return SAMPLES["batch_centered"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output is wrong when dim 0 of `x` (size 4 in your sample) is 1",
        "*worst element: output[[]0, *[]]: expected 0, got *",
        "*hint: only size 1 is wrong (right at 2, 3, 4, 5, 8, 9; wrong at 1): a dim of size 1 is dropped or "
        "mishandled, e.g. a squeeze() that removes it too*",
    ])


def test_a_triton_kernel_whose_backward_grid_forgets_the_last_program_fails_in_the_interpreter(pytester, run_pytest):
    pytest.importorskip("triton")
    from pytest_autograd.engine.triton_interpreter import interpreter_on

    if not interpreter_on():
        pytest.skip("Triton kernels run on CPU tensors only in the interpreter (TRITON_INTERPRET=1)")
    pytester.makepyfile(test_ops="""
        import pytest
        from reference_ops.sizes_triton import TritonScaleColumnsGridFloor, scale_columns_reference, SAMPLES

        @pytest.mark.autograd_op(op=TritonScaleColumnsGridFloor, reference=scale_columns_reference)
        def test_scale():
            return SAMPLES()
    """)
    result = run_pytest("--autograd-checks=sizes")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when dim 0 (size 8 in your sample) is 9",
        "*worst element: grad x[[]8, *[]]: expected *, got 0",
        "*hint: the wrong sizes are exactly those that are not a multiple of 4 *not n // BLOCK)",
    ])


def test_a_backward_that_returns_a_squeezed_gradient_at_size_one_fails_naming_the_shape(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        class RowScale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return x * w[:, None]

            @staticmethod
            def backward(ctx, grad):
                x, w = ctx.saved_tensors
                return grad * w[:, None], (grad * x).sum(1).squeeze()   # BUG: a batch of one loses its dim

        @pytest.mark.autograd_op(op=RowScale)
        def test_row_scale():
            return [(torch.randn(4, 3), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's backward raised RuntimeError when dim 0 of `x` (size 4 in your sample) is 1: *invalid gradient*",
        "*hint: *squeeze*",
    ])


def test_a_float32_only_kernel_with_a_tail_bug_is_judged_in_float32_and_fails(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        class Float32OnlySoftmaxTail(TiledSoftmaxTailReadsNextRow):
            @staticmethod
            def forward(ctx, x):
                if x.dtype != torch.float32:
                    raise TypeError(f"only float32 is supported, got {x.dtype}")
                return TiledSoftmaxTailReadsNextRow.forward(ctx, x)

        @pytest.mark.autograd_op(op=Float32OnlySoftmaxTail, reference=softmax_reference)
        def test_with_reference():
            return SAMPLES["softmax"]()

        @pytest.mark.autograd_op(op=Float32OnlySoftmaxTail)
        def test_without():
            return SAMPLES["softmax"]()
    """)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "output is wrong when dim 1 of `x` (size 8 in your sample) is 9",
        "*check sizes, device cpu, dtype float32, sample 0",
        "*normwise error * > budget *",
        "*judged by: outputs and gradients in float32 against the reference's in float64 on the same rounded inputs",
    ])
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when dim 1 (size 8 in your sample) is 9",
        "*check sizes, device cpu, dtype float32, sample 0",
        "*judged by: central differences in float32*",
    ])


# ---------------------------------------------------------------------------
# No false alarms: correct twins, refused sizes, shapes tied across arguments
# ---------------------------------------------------------------------------

CORRECT_TWINS = """
@pytest.mark.autograd_op(op=TiledSoftmax, reference=softmax_reference)
def test_softmax():
    return SAMPLES["softmax"]()

@pytest.mark.autograd_op(op=SplitKMatmul, reference=matmul_reference)
def test_matmul():
    return SAMPLES["matmul"]()

@pytest.mark.autograd_op(op=BatchCentered, reference=batch_centered_reference)
def test_centered():
    return SAMPLES["batch_centered"]()

@pytest.mark.autograd_op(op=FixedWidthScale, reference=scale_reference)
def test_fixed_width():
    return SAMPLES["fixed_width"]()
"""

BUGGY_TWINS = """
@pytest.mark.autograd_op(op=TiledSoftmaxTailReadsNextRow, reference=softmax_reference, skip=["sizes"])
def test_softmax_tail():
    return SAMPLES["softmax"]()

@pytest.mark.autograd_op(op=TiledSoftmaxGridFloor, reference=softmax_reference, skip=["sizes"])
def test_softmax_grid():
    return SAMPLES["softmax"]()

@pytest.mark.autograd_op(op=SplitKMatmulInclusiveEnd, reference=matmul_reference, skip=["sizes"])
def test_matmul_split():
    return SAMPLES["matmul"]()

@pytest.mark.autograd_op(op=BatchCenteredSqueeze, reference=batch_centered_reference, skip=["sizes"])
def test_centered_squeeze():
    return SAMPLES["batch_centered"]()
"""


def test_the_correct_twins_pass_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=HEADER + CORRECT_TWINS)
    result = run_pytest("-rfs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 4 * 12


def test_at_their_power_of_two_samples_the_buggy_twins_pass_every_other_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=HEADER + BUGGY_TWINS)
    result = run_pytest("-rfs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 4 * 12


def test_the_correct_triton_kernel_passes_every_default_check_and_its_twin_every_other(pytester, run_pytest):
    pytest.importorskip("triton")
    from pytest_autograd.engine.triton_interpreter import interpreter_on

    if not interpreter_on():
        pytest.skip("Triton kernels run on CPU tensors only in the interpreter (TRITON_INTERPRET=1)")
    pytester.makepyfile(test_ops="""
        import pytest
        from reference_ops.sizes_triton import *

        @pytest.mark.autograd_op(op=TritonScaleColumns, reference=scale_columns_reference)
        def test_scale():
            return SAMPLES()

        @pytest.mark.autograd_op(op=TritonScaleColumnsGridFloor, reference=scale_columns_reference, skip=["sizes"])
        def test_scale_grid_floor():
            return SAMPLES()
    """)
    result = run_pytest("-rfs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 2 * 10


def test_a_width_the_kernel_refuses_is_noted_and_the_other_dims_are_still_judged(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=FixedWidthScale, reference=scale_reference)
        def test_fixed_width():
            return SAMPLES["fixed_width"]()
    """, "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*sample 0: sizes: dim 1 of `x` (size 8 in your sample): the op refuses 1, 7, 9, 17, 2051 (ValueError: "
        "FixedWidthScale is built for rows of 8 elements, *): not judged there*",
    ])


def test_sizes_none_keeps_a_dim_fixed_without_a_note(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=FixedWidthScale, reference=scale_reference, sizes={8: None})
        def test_fixed_width():
            return SAMPLES["fixed_width"]()
    """, "-rP")
    result.assert_outcomes(passed=1)
    assert "the op refuses" not in result.stdout.str()


def test_an_op_that_refuses_every_variant_is_skipped_saying_why(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        def exactly_4_by_8(x):
            if tuple(x.shape) != (4, 8):
                raise ValueError("built for 4 x 8 only")
            return x * 2

        @pytest.mark.autograd_op(op=exactly_4_by_8)
        def test_fixed():
            return [(torch.randn(4, 8),)]
    """)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no size variant could be judged: sample 0, dim 0 of `x` (size 4) at 5: "
                                 "ValueError: built for 4 x 8 only; sample 0, dim 0 of `x` (size 4) at 3: *"])


def test_an_op_without_dims_to_resize_is_skipped_saying_why(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=torch.mul)
        def test_scalars():
            return [(torch.tensor(1.5), torch.ones(1, 1))]
    """)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no dimension to resize: every floating tensor argument has only dims of "
                                 "size 0 or 1"])


def test_explicit_sizes_replace_the_derived_ones(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmaxTailReadsNextRow, sizes={8: [12, 16, 13], 4: None})
        def test_softmax():
            return SAMPLES["softmax"]()

        @pytest.mark.autograd_op(op=TiledSoftmaxTailReadsNextRow, sizes={8: [12, 16], 4: None})
        def test_softmax_at_multiples_of_the_block():
            return SAMPLES["softmax"]()
    """)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `x` is wrong when dim 1 (size 8 in your sample) is 13"])


def test_an_int_argument_equal_to_a_size_changes_with_it():
    def rows_of(x, n_cols):  # a kernel wrapper that takes the row length as an argument
        return x.reshape(-1, n_cols).sum(-1)

    outcome = sizes_outcome(rows_of, [Sample(torch.randn(3, 8), 8)], reference=lambda x, n_cols: x.sum(-1))
    assert outcome.status == "passed", outcome.detail
    assert "refuses" not in outcome.detail


class SortReversedGradientPastOneBlock(torch.autograd.Function):
    """BUG: on rows longer than one block (1024), the gradient of the i-th smallest value goes to the i-th largest
    element."""

    @staticmethod
    def forward(ctx, x):
        values, indices = torch.sort(x, -1)
        ctx.save_for_backward(indices)
        return values

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        if grad.shape[-1] > 1024:
            grad = grad.flip(-1)
        return torch.zeros_like(grad).scatter(-1, indices, grad)


@pytest.mark.xfail(strict=True, reason=(
    "known false alarm: the 3 x 2051 variant of this sample holds two exact ties (jittered values rounded to "
    "float32) with near ties around them; no tie-breaking step is safe at the tensor's smallest gap, and every "
    "probe crosses several kinks within one step. Judging again at smaller steps hid wrong gradients of noisy "
    "float32 ops, so it is not done"))
def test_a_sort_whose_large_variant_ties_values_passes():
    sample = [Sample(torch.randn(3, 5, generator=torch.Generator().manual_seed(144)))]  # 2 of 200 seeds fail
    right = sizes_outcome(lambda x: torch.sort(x, -1).values, sample)
    assert right.status == "passed", right.detail


def test_a_sort_wrong_only_past_one_block_fails_at_the_size_that_shows_it():
    sample = [Sample(torch.randn(3, 5, generator=torch.Generator().manual_seed(149)))]
    wrong = sizes_outcome(SortReversedGradientPastOneBlock.apply, sample)
    assert wrong.status == "failed", wrong.detail
    assert "gradient w.r.t. `x` is wrong when dim 1 (size 5 in your sample) is 2051" in wrong.detail


@pytest.mark.parametrize("op, samples, options", [
    pytest.param(torch.nn.Linear(4, 3), [Sample(torch.randn(2, 4))], {}, id="module parameters"),
    pytest.param(torch.nn.functional.layer_norm, [Sample(torch.randn(3, 6), [6], torch.randn(6), torch.randn(6))],
                 {"reference": torch.nn.functional.layer_norm}, id="normalized_shape follows its dim"),
    pytest.param(torch.nn.functional.cross_entropy, [Sample(torch.randn(4, 5), torch.tensor([0, 4, 2, 1]))], {},
                 id="integer targets"),
    pytest.param(lambda idx, w: torch.nn.functional.embedding(idx, w),
                 [Sample(torch.tensor([1, 9, 3, 0, 5, 7]), torch.randn(10, 4))], {}, id="indices into a resized dim"),
    pytest.param(lambda q, k, v, mask: torch.softmax(q @ k.mT + mask, -1) @ v,
                 [Sample(torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8),
                         torch.full((4, 4), float("-inf")).triu(1))], {"constants": ("mask",)},
                 id="a -inf mask constant"),
    pytest.param(lambda x, scale: x * scale, [Sample(torch.randn(3, 4), torch.tensor(1.5))], {}, id="0-d tensor"),
    pytest.param(torch.tanh, [Sample(torch.randn(0, 4))], {}, id="size-0 dim"),
    pytest.param(lambda x, *, w: x * w, [Sample(torch.randn(3, 4), w=torch.randn(4))], {}, id="keyword tensor"),
    pytest.param(lambda x, k: torch.topk(x, k).values, [Sample(torch.randn(3, 6), 3)], {}, id="k equal to a size"),
    pytest.param(lambda a: torch.linalg.cholesky(a @ a.mT + 4 * torch.eye(a.shape[-1], dtype=a.dtype)),
                 [Sample(torch.randn(4, 4))], {}, id="square matrices"),
    # values of its own: a few global draws give the known tied-values false alarm (the strict xfail above)
    pytest.param(lambda x: torch.sort(x, -1).values,
                 [Sample(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)))], {}, id="sort"),
    pytest.param(torch.logdet, [Sample(torch.randn(4, 4) @ torch.randn(4, 4).T + torch.eye(4))], {},
                 id="outside the domain at some sizes"),
    pytest.param(lambda z: (z * z.conj()).real, [Sample(torch.randn(3, 4, dtype=torch.complex64))], {},
                 id="complex"),
])
def test_correct_ops_with_shape_constraints_never_fail(op, samples, options):
    outcome = sizes_outcome(op, samples, **options)
    assert outcome.status in ("passed", "skipped"), outcome.detail


class DiagonalOfSquare(torch.autograd.Function):
    """The diagonal of a square matrix; backward ``diag_embed`` assumes the input was square, and nothing checks."""

    @staticmethod
    def forward(ctx, a):
        return a.diagonal(dim1=-2, dim2=-1).clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.diag_embed(grad)


def _rows_softmax(x, n_rows):  # a wrapper launching one program per row, told the row count
    out = torch.zeros_like(x)
    out[:n_rows] = x[:n_rows].softmax(-1)
    return out


def _causal_softmax(x):  # masks column > row of its own (rows, columns)
    keep = torch.ones(x.shape[-2:], dtype=torch.bool).tril()
    return x.masked_fill(~keep, float("-inf")).softmax(-1)


def _causal_reference(x):  # builds the (n, n) mask from the last dim, so it broadcasts over a single row
    n = x.shape[-1]
    return x.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


@pytest.mark.parametrize("op, sample, reference", [
    pytest.param(DiagonalOfSquare.apply, Sample(torch.randn(160, 160)), lambda a: a.diagonal(), id="diagonal"),
    pytest.param(_rows_softmax, Sample(torch.randn(160, 160), 160), lambda x, n_rows: x.softmax(-1),
                 id="an int for the leading dim"),
    pytest.param(_causal_softmax, Sample(torch.randn(2, 128, 128)), _causal_reference, id="causal mask"),
    pytest.param(lambda r: r.diagonal(dim1=-2, dim2=-1).sum(-1), Sample(torch.randn(4096, 3, 3)),
                 lambda r: r.diagonal(dim1=-2, dim2=-1).sum(-1), id="many small square matrices"),
])
def test_ops_that_assume_equal_dims_of_a_large_square_sample_are_never_failed_for_it(op, sample, reference):
    # Sizes match by value: the dims of a square sample change together even on a large sample, where
    # changing them apart (cheaper: the other could be cut) gives shapes these ops never meant to accept.
    outcome = sizes_outcome(op, [sample], reference=reference)
    assert outcome.status == "passed", outcome.detail


def _bmm_wrong_at_an_odd_batch(a, b):
    out = torch.bmm(a, b)
    return out * 1.01 if a.shape[0] % 2 else out


def _attention_wrong_at_an_odd_head_dim(q, k, v, mask):
    out = torch.softmax(q @ k.mT + mask, -1) @ v
    return out * 1.01 if q.shape[-1] % 2 else out


def _attention(q, k, v, mask):
    return torch.softmax(q @ k.mT + mask, -1) @ v


def test_a_batch_bug_of_a_batched_square_matmul_is_caught_on_a_large_sample():
    outcome = sizes_outcome(_bmm_wrong_at_an_odd_batch, [Sample(torch.randn(2, 128, 128), torch.randn(2, 128, 128))],
                            reference=torch.bmm)
    assert outcome.status == "failed"
    assert "output is wrong when dim 0 of `a` (size 2 in your sample) is 3" in outcome.detail


def test_a_head_dim_bug_of_attention_with_a_square_mask_per_batch_is_caught():
    q, k, v = (torch.randn(2, 128, 64) for _ in range(3))
    mask = torch.full((128, 128), float("-inf")).triu(1).expand(2, 128, 128).clone()
    outcome = sizes_outcome(_attention_wrong_at_an_odd_head_dim, [Sample(q, k, v, mask)], reference=_attention,
                            constants=("mask",))
    assert outcome.status == "failed"
    assert "output is wrong when dim 2 of `q` (size 64 in your sample) is 65" in outcome.detail


def test_a_size_that_an_integer_tensor_holds_as_a_value_is_kept_and_noted():
    def segment_sums(x, cu_seqlens):
        return torch.stack([x[int(a):int(b)].sum(0) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])])

    outcome = sizes_outcome(segment_sums, [Sample(torch.randn(7, 4), torch.tensor([0, 3, 7]))])
    assert outcome.status == "passed", outcome.detail
    assert "sizes: dim 0 of `x` (size 7 in your sample) kept: `cu_seqlens` holds it as its largest value" \
        in outcome.detail


def test_a_float32_only_kernel_with_a_long_reduction_is_never_failed_for_rounding():
    from reference_ops.sizes import SplitKMatmul

    class Float32OnlySplitK(SplitKMatmul):
        @staticmethod
        def forward(x, weight):
            if x.dtype != torch.float32:
                raise TypeError(f"only float32 is supported, got {x.dtype}")
            return SplitKMatmul.forward(x, weight)

    samples = [Sample(torch.randn(2, 64), torch.randn(4, 64))]
    for reference in (lambda x, weight: x @ weight.T, None):
        outcome = sizes_outcome(Float32OnlySplitK, samples, reference=reference)
        assert outcome.status == "passed", outcome.detail
        assert "judged by" in outcome.detail and "float32" in outcome.detail


# ---------------------------------------------------------------------------
# sizes= on the marker: validated, with the fix in the message
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sizes, message", [
    ([8, 9], "sizes= must be a dict from a dimension size in your samples to the sizes to try instead"),
    ({"x": [3]}, "sizes= keys are dimension sizes of your samples (ints >= 0), got 'x'"),
    ({8: "9"}, "sizes={8: '9'}: give a list of sizes to try instead of 8, or None to keep 8 fixed"),
    ({8: [9, -1]}, "sizes={8: ...} holds -1; sizes are ints >= 0"),
    ({65: None}, "sizes= names size 65, which no floating tensor argument of any sample has; the sizes in your "
                 "samples are: 4, 8."),
])
def test_a_malformed_sizes_option_is_refused_naming_the_fix(sizes, message):
    from reference_ops.sizes import TiledSoftmax

    with pytest.raises(UsageProblem) as raised:
        sizes_outcome(TiledSoftmax, [Sample(torch.randn(4, 8))], sizes=sizes)
    assert message in str(raised.value)


def test_a_malformed_sizes_option_fails_the_item_with_the_message(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmax, sizes={65: None})
        def test_softmax():
            return SAMPLES["softmax"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*sizes= names size 65, which no floating tensor argument of any sample has*"])


# ---------------------------------------------------------------------------
# The variants themselves, and the patterns the hints state
# ---------------------------------------------------------------------------


def test_each_size_is_tried_one_past_and_one_short_of_itself_at_one_past_a_power_of_two_and_over_several_blocks():
    from pytest_autograd.checks._size_variants import derived_sizes

    assert [size for size, _ in derived_sizes(256, lambda m: 8 * m, 8 * 256)] == [257, 255, 1, 513, 11, 19, 45, 2051]
    assert [size for size, _ in derived_sizes(2, lambda m: m, 2)] == [3, 1, 5, 2051]
    assert [size for size, _ in derived_sizes(32, lambda m: m, 32)] == [33, 31, 1, 65, 11, 2051]  # fits a warp already
    square = [size for size, _ in derived_sizes(4, lambda m: m * m, 16)]
    assert square[:4] == [5, 3, 1, 9] and square[4] * square[4] <= 1 << 18 and square[4] % 8 == 3


def test_a_variant_changes_every_dim_and_int_of_the_size_and_keeps_values_in_the_samples_range():
    from pytest_autograd.checks._size_variants import axes_of, variant
    from pytest_autograd.engine.case import build_case

    x, w = torch.rand(3, 4) + 1.0, torch.rand(4, 4)
    case = build_case({"op": lambda x, w, n, idx: x, "constants": ("w",)}, [Sample(x, w, 4, torch.tensor([0, 3, 2]))])
    (axis,) = [a for a in axes_of(case, case.samples[0], {}) if a.size == 4]
    assert [p.describe() for p in axis.places] == ["dim 1 of `x`", "dim 0 of `w`", "dim 1 of `w`",
                                                   "`n` (an int argument equal to the size)"]
    grown = variant(case, case.samples[0], axis, 9, torch.Generator().manual_seed(0))
    gx, gw, n, _ = grown.args
    assert gx.shape == (3, 9) and gw.shape == (9, 9) and n == 9
    assert torch.equal(gx[:, 4:8], x) and bool((gx >= x.min()).all() and (gx <= x.max()).all())
    assert len(set(gx.flatten().tolist())) == gx.numel(), "repeated values must not tie"
    assert torch.equal(gw[:4, 4:8], w), "constants are repeated exactly"
    shrunk = variant(case, case.samples[0], axis, 2, torch.Generator().manual_seed(0))
    assert torch.equal(shrunk.args[0], x[:, :2]) and shrunk.args[2] == 2
    assert shrunk.args[3].tolist() == [0, 1, 0], "indices that could index the shrunk dim stay inside it"


@pytest.mark.parametrize("observed, start", [
    ({1: False, 2: True, 3: True, 4: True, 5: True}, "only size 1 is wrong"),
    ({1: False, 3: False, 4: True, 5: False, 8: True, 9: False}, "the wrong sizes are exactly those that are not a "
                                                                   "multiple of 4"),
    ({1: True, 4: True, 8: True, 9: False, 16: False}, "sizes up to 8 are right and every larger one is wrong"),
    ({1: False, 3: False, 8: True, 9: True}, "sizes below 8 are wrong and the others right"),
    ({1: True, 3: False, 8: True, 9: True}, None),
])
def test_a_pattern_is_stated_only_when_every_size_judged_fits_it(observed, start):
    from pytest_autograd.checks._size_hints import pattern_hint

    hint = pattern_hint(observed)
    assert (hint is None) if start is None else hint.startswith(start), hint


class CompilesAtEachShapeDropsRowsPast1024(torch.autograd.Function):
    """A GPU kernel compiled at the first call for each shape (as Triton specializes on sizes), whose backward
    grid covers 1024 rows at most: the rows past it get no gradient."""

    compiled = set()

    @staticmethod
    def forward(ctx, x):
        if x.shape not in CompilesAtEachShapeDropsRowsPast1024.compiled:
            CompilesAtEachShapeDropsRowsPast1024.compiled.add(x.shape)
            time.sleep(0.6)  # the compile, once per shape: longer than a forward may take when timed warm
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad_x = grad * 2
        grad_x[1024:] = 0
        return grad_x


def test_a_kernel_compiled_at_each_new_shape_on_a_gpu_is_still_judged_at_several_blocks(monkeypatch):
    from pytest_autograd.checks import _size_judge

    monkeypatch.setattr(_size_judge, "first_call_may_compile", lambda device: True)  # as on a GPU
    CompilesAtEachShapeDropsRowsPast1024.compiled.clear()
    # isolate="off": the patch above holds in this process only
    outcome = sizes_outcome(CompilesAtEachShapeDropsRowsPast1024, [Sample(torch.randn(4, 3))], isolate="off")
    assert outcome.status == "failed", outcome.detail
    assert "made smaller" not in outcome.detail
    assert "gradient w.r.t. `x` is wrong when dim 0 (size 4 in your sample) is 2051" in outcome.detail


class CompilesPerBlockSize(torch.autograd.Function):
    """A GPU kernel compiled once per power-of-two block (as a Triton kernel with BLOCK=next_power_of_2(rows))."""

    compiled = set()

    @staticmethod
    def forward(ctx, x):
        block = 1 << max(0, x.shape[0] - 1).bit_length()
        if block not in CompilesPerBlockSize.compiled:
            CompilesPerBlockSize.compiled.add(block)
            time.sleep(0.3)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_a_variant_whose_kernel_compiles_is_not_stopped_as_slower_than_the_first(monkeypatch):
    from pytest_autograd.checks import _size_judge, sizes

    monkeypatch.setattr(_size_judge, "first_call_may_compile", lambda device: True)  # as on a GPU
    monkeypatch.setattr(sizes, "first_call_may_compile", lambda device: True)
    monkeypatch.setattr(sizes, "VARIANT_SECONDS", 0.05)  # the first variant's pace, shortened for the test
    monkeypatch.setattr(sizes, "VARIANT_SLOWDOWN", 1.0)
    CompilesPerBlockSize.compiled.clear()
    outcome = sizes_outcome(CompilesPerBlockSize, [Sample(torch.randn(4, 3))], isolate="off")  # the patches hold here
    assert outcome.status == "passed", outcome.detail
    assert "stopped after" not in outcome.detail, outcome.detail


def test_a_several_blocks_size_too_slow_to_judge_is_made_smaller_and_noted():
    import time

    def slow_past_50_rows(x):
        if x.shape[0] > 50:  # a kernel run by an interpreter: slow in proportion to its programs
            for _ in range(100):
                time.sleep(0.05)
        return x * 2

    outcome = sizes_outcome(slow_past_50_rows, [Sample(torch.randn(4, 3))], reference=lambda x: x * 2)
    assert outcome.status == "passed", outcome.detail
    assert "the several-blocks sizes were made smaller to stay within the time budget" in outcome.detail
    found = re.search(r"sample 0, dim 0 of `x` \(size 4\): (\d+) instead of 2051 \(one forward at \d+ takes over "
                      r"0\.25 s", outcome.detail)
    assert found is not None and 9 < int(found.group(1)) <= 50, outcome.detail


def test_a_bug_at_the_samples_own_size_is_left_to_gradcheck_which_reports_it():
    from reference_ops.buggy import LinearWeightGradTransposed

    samples = [Sample(torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))]
    gradcheck, sizes = run_checks(LinearWeightGradTransposed, samples=samples, checks=["gradcheck", "sizes"])
    assert gradcheck.status == "failed"
    assert sizes.status == "skipped", sizes.detail
    assert sizes.detail.startswith("the op is wrong at your sample's own sizes too (gradient w.r.t. `weight`, and "
                                   "when dim ")
    assert "gradcheck and reference report it there" in sizes.detail


def test_an_op_that_raises_at_its_own_sample_fails_as_it_does_in_every_check():
    class BackwardRaises(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("my kernel has no backward for this shape")

    outcome = sizes_outcome(BackwardRaises, [Sample(torch.randn(3, 4))])
    assert outcome.status == "failed"
    assert outcome.detail.startswith("the op's backward raised RuntimeError: my kernel has no backward for this shape")


def test_a_bfloat16_gradient_bug_without_a_reference_fails_sizes_even_where_gradcheck_misses_it():
    # sizes once skipped "wrong at your sample's own sizes too: gradcheck reports it there", while gradcheck, as
    # coarse as sizes in bfloat16 without a reference, passed: every check green on a wrong op.
    from pytest_autograd import run_checks
    from reference_ops.low_precision import SwishBfloat16OnlyDroppedTerm

    verdicts = []
    for seed in range(6):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        outcomes = {o.check: o for o in run_checks(SwishBfloat16OnlyDroppedTerm, x, seed=seed,
                                                   checks=["gradcheck", "sizes"])}
        verdicts.append((outcomes["gradcheck"].status, outcomes["sizes"].status))
        assert outcomes["sizes"].status == "failed", outcomes["sizes"].detail
        assert "judged coarsely (central differences in bfloat16, no reference=)" in outcomes["sizes"].detail
        assert "squeeze" not in outcomes["sizes"].detail  # no size pattern is claimed from coarse verdicts
    assert ("passed", "failed") in verdicts, verdicts  # the case this guards: gradcheck alone would be green


# ---------------------------------------------------------------------------
# Streaming kernels: the state carried from block to block
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("op, reference", [
    ("OnlineSoftmaxNoRescale", "softmax_reference"),
    ("BlockRowMaxNoOffset", "row_max_reference"),
])
def test_a_streaming_kernel_wrong_when_a_later_block_holds_the_max_fails_at_a_width_past_one_block(
        pytester, run_pytest, op, reference):
    result = run(pytester, run_pytest, f"""
        @pytest.mark.autograd_op(op={op}, reference={reference})
        def test_streaming():
            return SAMPLES["streaming"]()
    """, checks="gradcheck,reference,sizes")
    result.assert_outcomes(passed=2, failed=1)  # right at the sample: its rows fit one block
    result.stdout.re_match_lines([r".* is wrong when dim 1 (of `x` )?\(size 8 in your sample\) is 2051$"])


@pytest.mark.parametrize("op, reference, family", [
    ("OnlineSoftmax", "softmax_reference", "streaming"),
    ("BlockRowMax", "row_max_reference", "streaming"),
    ("WarpSoftmax", "softmax_reference", "warp"),
    ("RowNormalize", "row_normalize_reference", "rows"),
    ("TiledSoftmax", "softmax_reference", "rows"),
    ("GroupNorm", "group_norm_reference", "channels"),
    ("TokenShift", "token_shift_reference", "tokens"),
    ("TokenShift", "None", "tokens"),
    ("ClassesAtDimOneCrossEntropy", "torch.nn.functional.cross_entropy", "logits"),
])
def test_the_correct_twins_of_the_streaming_warp_and_rank_bugs_pass_every_default_check(
        pytester, run_pytest, op, reference, family):
    pytester.makepyfile(test_ops=HEADER + textwrap.dedent(f"""
        @pytest.mark.autograd_op(op={op}, reference={reference})
        def test_twin():
            return SAMPLES["{family}"]()
    """))
    result = run_pytest("-rs")
    assert result.ret == 0, result.stdout.str()


def test_a_wider_variant_keeps_the_samples_own_values_in_its_last_whole_copy():
    from pytest_autograd.checks._size_variants import axes_of, variant
    from pytest_autograd.engine.case import build_case

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    case = build_case({"op": lambda x: x}, [Sample(x)])
    (axis,) = [a for a in axes_of(case, case.samples[0], {}) if a.size == 8]
    grown = variant(case, case.samples[0], axis, 2051, torch.Generator().manual_seed(0)).args[0]
    assert torch.equal(grown[:, 2040:2048], x), "the last whole copy holds the sample's values"
    assert not bool((grown[:, :8] == x).any()), "the first copy is moved"
    assert torch.equal(grown.amax(-1), x.amax(-1)) and bool((grown.argmax(-1) >= 2040).all())


def test_a_warp_path_that_drops_an_odd_rows_last_element_fails_at_the_odd_widths_inside_one_warp(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=WarpSoftmaxOddRowDropsLast, reference=softmax_reference)
        def test_warp():
            return SAMPLES["warp"]()
    """, checks="gradcheck,reference,sizes")
    result.assert_outcomes(passed=2, failed=1)  # its sample's rows are wider than a warp
    result.stdout.fnmatch_lines(["output is wrong when dim 1 of `x` (size 64 in your sample) is 11",
                                 "*sizes judged for this dim: right at 1, 32, 63, 64, 65, 128, 129; wrong at 11, 19"])


# ---------------------------------------------------------------------------
# One more leading dim: ops sampled on (rows, features), called on 3-D activations
# ---------------------------------------------------------------------------


def test_a_backward_reducing_over_dim_one_fails_for_a_3d_activation_even_without_a_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=RowNormalizeBackwardSumsDimOne)
        def test_rows():
            return SAMPLES["rows"]()
    """, checks="gradcheck,sizes")
    result.assert_outcomes(passed=1, failed=1)  # right for every 2-D size: gradcheck passes it
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when `x` gets one more leading dim: (4, 8) as (2, 4, 8)",
        "*judged by: the derivative engine in float64 (finite differences)",
        "*hint: the op (or its backward) is written for the sample's number of dims: read sizes from the end*",
    ])


def test_a_kernel_taking_rows_from_dim_zero_fails_for_a_3d_activation_against_its_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmaxRowsFromDimZero, reference=softmax_reference)
        def test_rows():
            return SAMPLES["rows"]()
    """, checks="gradcheck,reference,sizes")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "output is wrong when `x` gets one more leading dim: (4, 8) as (2, 4, 8)",
        "*judged by: each copy's outputs against the op's own on the sample (copies of it along a new dim 0)",
    ])


def test_a_loss_dividing_by_the_row_count_of_2d_logits_fails_when_they_get_a_leading_dim(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import torch.nn.functional as F

        @pytest.mark.autograd_op(op=CrossEntropyDividesByShapeZero, reference=F.cross_entropy)
        def test_loss():
            return SAMPLES["logits"]()
    """, checks="gradcheck,reference,sizes")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `logits` is wrong when `logits` (and `target`) gets one more leading dim: (6, 5) as (2, 6, 5)",
        "*judged by: the derivative engine in float64 (finite differences)"])


def test_the_cross_entropy_of_every_leading_dim_passes_with_a_reference_that_reads_3d_input_otherwise():
    import torch.nn.functional as F
    from reference_ops.edges import CrossEntropy
    from reference_ops.sizes import SAMPLES

    outcome = sizes_outcome(CrossEntropy, [Sample(*SAMPLES["logits"]()[0])], reference=F.cross_entropy)
    assert outcome.status == "passed", outcome.detail


def test_a_declared_surrogate_gradient_is_judged_at_the_leading_dim_by_its_copies_only():
    from reference_ops.surrogate import SignStraightThrough, sign_straight_through_reference

    for rows in (8, 64):
        x = torch.randn(rows, rows, generator=torch.Generator().manual_seed(0))
        outcome = sizes_outcome(SignStraightThrough, [Sample(x)], reference=sign_straight_through_reference,
                                surrogate_grad=True)
        assert outcome.status == "passed", outcome.detail


class SoftTargetLoss(torch.autograd.Function):
    """-(q * log p).sum() / rows: its gradient is the target's shape, whichever dims the activation has."""

    @staticmethod
    def forward(ctx, log_p, q):
        ctx.save_for_backward(log_p, q)
        ctx.rows = log_p.shape[:-1].numel()
        return -(q * log_p).sum() / ctx.rows

    @staticmethod
    def backward(ctx, grad):
        log_p, q = ctx.saved_tensors
        return -q * grad / ctx.rows, -log_p * grad / ctx.rows


class ArgmaxAndProduct(torch.autograd.Function):
    """An integer first output beside a float one."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.argmax(-1), x @ w

    @staticmethod
    def backward(ctx, _, grad):
        x, w = ctx.saved_tensors
        return grad @ w.transpose(-1, -2), x.reshape(-1, x.shape[-1]).transpose(0, 1) @ grad.reshape(-1, grad.shape[-1])


@pytest.mark.parametrize("op, sample, reference", [
    # the target left unstacked gives a gradient of its shape: stacking it with the activation is tried next
    (SoftTargetLoss, lambda g: (torch.randn(6, 5, generator=g).log_softmax(-1), torch.rand(6, 5, generator=g)),
     lambda log_p, q: -(q * log_p).sum() / log_p.shape[:-1].numel()),
    # a max over dim 0 reads the new dim: exact copies would tie every element with its copy
    (lambda x: x.max(0).values, lambda g: (torch.randn(16, 16, generator=g),), None),
    # an integer output must not set the tolerance of the float ones
    (ArgmaxAndProduct, lambda g: (torch.randn(1, 256, generator=g), torch.randn(256, 256, generator=g)),
     lambda x, w: (x.argmax(-1), x @ w)),
])
def test_correct_ops_are_never_failed_for_the_leading_dim(op, sample, reference):
    for seed in range(3):
        outcome = sizes_outcome(op, [Sample(*sample(torch.Generator().manual_seed(seed)))], reference=reference,
                                seed=seed)
        assert outcome.status == "passed", outcome.detail


def test_a_reference_that_refuses_the_leading_dim_leaves_the_copies_uncompared():
    from reference_ops.sizes import BatchCentered, SAMPLES, batch_centered_reference

    def two_dims_only(x, weight):  # the op centers over dim 0 by design: its copies differ from its 2-D output
        if x.dim() != 2:
            raise ValueError("2-D only")
        return batch_centered_reference(x, weight)

    outcome = sizes_outcome(BatchCentered, [Sample(*SAMPLES["batch_centered"]()[0])], reference=two_dims_only)
    assert outcome.status == "passed", outcome.detail


def test_an_op_that_refuses_a_third_dim_is_noted_not_failed():
    class Only2D(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if x.dim() != 2:
                raise ValueError(f"expected a 2-D input, got {x.dim()}-D")
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    outcome = sizes_outcome(Only2D, [Sample(torch.randn(4, 8))])
    assert outcome.status == "passed"
    assert ("not judged when `x` gets one more leading dim: (4, 8) as (2, 4, 8): the op refuses it (ValueError: "
            "expected a 2-D input, got 3-D)") in outcome.detail, outcome.detail


FIXED_RANK = """
import torch.nn.functional as F

@pytest.mark.autograd_op(op=TokenShift)
def test_token_shift():
    return SAMPLES["tokens"]()

@pytest.mark.autograd_op(op=ClassesAtDimOneCrossEntropy, reference=F.cross_entropy)
def test_loss():
    return SAMPLES["logits"]()
"""


def test_ops_written_for_a_fixed_rank_are_noted_not_failed_where_their_forward_does_not_batch_a_leading_dim(
        pytester, run_pytest):
    result = run(pytester, run_pytest, FIXED_RANK)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*AutogradNote: sample 0: sizes: not judged when `x` gets one more leading dim: (3, 6, 8) as (2, 3, 6, 8): "
        "gradient w.r.t. `x` is off (grad x[[]*[]]: expected *, got *); its forward does not treat the new dim as a "
        "batch (its outputs there are not copies of its outputs on the sample, nor their sum or mean), and there is "
        "no reference= to say what the op computes there: nothing shows the op is meant to take one more dim; to judge "
        "it, add a sample with that many dims to the test (every check judges the samples' own shapes), or a "
        "reference= that takes them; if the op takes only its sample's number of dims, make it raise for others",
        "*AutogradNote: sample 0: sizes: not judged when `logits` gets one more leading dim: (6, 5) as (2, 6, 5): "
        "gradient w.r.t. `logits` is off (*); its forward does not treat the new dim as a batch (*), and reference= "
        "neither reads it as one nor agrees with the op there: nothing shows the op is meant to take one more dim; *",
    ])


def test_a_token_op_whose_forward_batches_over_a_leading_dim_fails_there_naming_the_evidence(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TokenShiftBackwardDimOne)
        def test_token_shift():
            return SAMPLES["tokens"]()
    """, checks="gradcheck,sizes")
    result.assert_outcomes(passed=1, failed=1)  # right at its three dims: gradcheck passes it
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` is wrong when `x` gets one more leading dim: (3, 6, 8) as (2, 3, 6, 8)",
        "*failed on evidence that the op is meant to work there: its forward treats the new dim as a batch (its "
        "outputs there are copies of its outputs on the sample, or their sum or mean)",
        "*hint: the op (or its backward) is written for the sample's number of dims*",
    ])


def test_a_kernel_whose_reference_batches_a_leading_dim_fails_there_naming_the_evidence(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        @pytest.mark.autograd_op(op=TiledSoftmaxRowsFromDimZero, reference=softmax_reference)
        def test_rows():
            return SAMPLES["rows"]()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*failed on evidence that the op is meant to work there: reference= treats the new "
                                 "dim as a batch (its outputs there are copies of its outputs on the sample)"])


def test_the_leading_dim_stacks_the_activation_alone_then_with_the_arguments_that_go_with_its_rows():
    from pytest_autograd.checks._leading_dim import leading_variants
    from pytest_autograd.engine.case import build_case

    x, target, weight = torch.randn(7, 5), torch.arange(7), torch.randn(7, 5)
    case = build_case({"op": lambda x, target, weight: x}, [Sample(x, target, weight)])
    alone, with_rows, weight_alone, weight_with_rows = leading_variants(case, case.samples[0], case.samples[0])
    assert [tuple(v.shape) for v in alone.sample.args] == [(2, 7, 5), (7,), (7, 5)]
    assert torch.equal(alone.sample.args[0][1], x) and alone.names == ["x"]
    assert [tuple(v.shape) for v in with_rows.sample.args] == [(2, 7, 5), (2, 7), (2, 7, 5)]
    assert with_rows.names == ["x", "target", "weight"] and weight_alone.names == ["weight"]


def test_the_leading_dim_is_taken_on_the_sample_cut_and_says_so():
    from pytest_autograd.checks._leading_dim import leading_variants
    from pytest_autograd.checks._size_variants import axes_of, cut_all
    from pytest_autograd.engine.case import build_case

    big = build_case({"op": lambda x: x}, [Sample(torch.randn(4096, 1024))])
    base, cuts = cut_all(big, big.samples[0], axes_of(big, big.samples[0], {}), 1 << 11)
    (variant,) = leading_variants(big, base, big.samples[0])
    assert base.args[0].numel() <= 1 << 11 and cuts
    assert variant.after == (2, *base.args[0].shape)
    assert f"{tuple(base.args[0].shape)} (your (4096, 1024), cut) as (2, " in variant.describe()


# ---------------------------------------------------------------------------
# Ops computing in float32: a size where any float32 formula cancels is noise, not a bug
# ---------------------------------------------------------------------------


def rms_norm_in_float64(x, weight, eps=1e-6):
    wide = x.double()
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


class FusedRMSNormZeroGradAtWidthOne(torch.autograd.Function):
    """BUG: a special case for rows of one element returns no input gradient."""

    @staticmethod
    def forward(ctx, x, weight, eps=1e-6):
        from reference_ops.fused import FusedRMSNorm

        ctx.width = x.shape[-1]
        return FusedRMSNorm.forward(ctx, x, weight, eps)

    @staticmethod
    def backward(ctx, grad):
        from reference_ops.fused import FusedRMSNorm

        dx, dweight, _ = FusedRMSNorm.backward(ctx, grad)
        return (dx.zero_() if ctx.width == 1 else dx), dweight, None


def rms_norm_samples():
    generator = torch.Generator().manual_seed(0)
    return [Sample(torch.randn(2, 3, 64, generator=generator), torch.randn(64, generator=generator) + 1)]


def test_a_float32_rms_norm_is_not_failed_at_a_width_of_one_where_its_gradient_cancels_in_any_float32_formula():
    from reference_ops.fused import FusedRMSNorm

    outcome = sizes_outcome(FusedRMSNorm.apply, rms_norm_samples(), reference=rms_norm_in_float64)
    assert outcome.status == "passed", outcome.detail


def test_a_float32_rms_norm_with_a_wrong_gradient_at_width_one_still_fails_there():
    outcome = sizes_outcome(FusedRMSNormZeroGradAtWidthOne.apply, rms_norm_samples(), reference=rms_norm_in_float64)
    assert outcome.status == "failed", outcome.detail
    assert "gradient w.r.t. `x` is wrong when dim 2 (size 64 in your sample) is 1" in outcome.detail
    assert "how far the op's own float32 result moves" in outcome.detail
