"""The behaviour checks judge a large sample on its first rows, each row whole, where the op treats rows alike,
and still catch what they catch."""

import pytest
import torch
import torch.nn.functional as F

from pytest_autograd.checks._fewer_rows import ROWS_ELEMENTS
from pytest_autograd.engine.api import run_checks
from reference_ops import LinearFunction
from reference_ops.buggy import LinearContiguousAssumption
from reference_ops.state import ExpHistoryOnClass
from reference_ops.transforms import NaiveSoftmax, StableSoftmax, softmax_reference

ROWS, WIDTH = 512, 1024  # 512k elements: over ROWS_ELEMENTS
CUT = ROWS_ELEMENTS // WIDTH  # the rows kept


def _large(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _one(op, samples, check, **options):
    """The check's outcome, run in this process (isolate="off"), where the calls the tests count are seen."""
    (outcome,) = run_checks(op, samples=samples, checks=[check], isolate="off", **options)
    return outcome


def _shapes_judged(fn, samples, check, **options):
    """The shapes of the last call of ``fn`` (the check's own, on what it judged), after asserting it passed."""
    op = ShapesSeen(fn)
    outcome = _one(op, samples, check, **options)
    assert outcome.status == "passed", outcome.detail
    return op.calls[-1]


class ShapesSeen:
    """Wraps a function and records the shapes of the tensors each call received."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args):
        self.calls.append(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        return self.fn(*args)


def test_extreme_still_catches_a_softmax_that_overflows_on_a_large_sample_and_names_the_rows_it_judged():
    outcome = _one(NaiveSoftmax.apply, [(_large(ROWS, WIDTH),)], "extreme", reference=softmax_reference)
    assert outcome.status == "failed"
    assert "output is NaN in float32 for inputs scaled to max |x| = 177.446" in outcome.detail
    assert f"judged on the first {CUT} of the {ROWS} rows (dim 0) of `x`" in outcome.detail


def test_extreme_passes_a_max_subtracted_softmax_on_a_large_sample():
    outcome = _one(StableSoftmax.apply, [(_large(ROWS, WIDTH),)], "extreme", reference=softmax_reference)
    assert outcome.status == "passed", outcome.detail


def test_each_row_is_kept_whole_and_only_the_rows_are_cut():
    op = ShapesSeen(torch.tanh)
    outcome = _one(op, [(_large(ROWS, WIDTH),)], "extreme", reference=torch.tanh)
    assert outcome.status == "passed", outcome.detail
    whole, *judged = op.calls  # the first call, on the whole sample, shows the path the op takes there
    assert whole == ((ROWS, WIDTH),) and set(judged) == {((CUT, WIDTH),)}


def test_an_op_that_takes_another_path_on_fewer_rows_is_judged_on_the_whole_sample():
    def kernel_for_large_batches(x):  # a fused path for large batches, a torch fallback for small ones
        return torch.tanh(x) if x.shape[0] >= ROWS else torch.sinh(x) / torch.cosh(x)

    shapes = _shapes_judged(kernel_for_large_batches, [(_large(ROWS, WIDTH),)], "extreme", reference=torch.tanh)
    assert shapes == ((ROWS, WIDTH),)


def test_a_bug_only_in_the_path_for_large_batches_is_still_caught():
    def naive_for_large_batches(x):  # right on a small batch: the bug lives where the user's sample goes
        return NaiveSoftmax.apply(x) if x.shape[0] >= ROWS else torch.softmax(x, -1)

    outcome = _one(naive_for_large_batches, [(_large(ROWS, WIDTH),)], "extreme", reference=softmax_reference)
    assert outcome.status == "failed"
    assert "output is NaN in float32 for inputs scaled to max |x| = 177.446" in outcome.detail
    assert "judged on the first" not in outcome.detail


def test_a_sample_that_fits_is_judged_whole():
    op = ShapesSeen(torch.tanh)
    outcome = _one(op, [(_large(ROWS_ELEMENTS // WIDTH, WIDTH),)], "extreme")
    assert outcome.status == "passed", outcome.detail
    assert set(op.calls) == {((ROWS_ELEMENTS // WIDTH, WIDTH),)}


def test_an_op_that_refuses_fewer_rows_is_judged_on_the_whole_sample():
    def fixed_batch(x):
        if x.shape[0] != ROWS:
            raise ValueError(f"this kernel is compiled for {ROWS} rows")
        return torch.tanh(x)

    shapes = _shapes_judged(fixed_batch, [(_large(ROWS, WIDTH),)], "extreme")
    assert shapes == ((ROWS, WIDTH),)


def test_a_target_per_row_is_cut_with_the_rows_it_belongs_to():
    def loss(logits, target):
        return F.cross_entropy(logits, target, reduction="none")

    target = torch.randint(0, WIDTH, (ROWS,), generator=torch.Generator().manual_seed(1))
    shapes = _shapes_judged(loss, [(_large(ROWS, WIDTH), target)], "extreme", reference=loss)
    assert shapes == ((CUT, WIDTH), (CUT,))


def test_a_square_layer_cuts_the_batch_and_keeps_the_weight_that_shares_its_size():
    x, weight, bias = _large(ROWS, ROWS), _large(ROWS, ROWS), _large(ROWS)  # cutting weight too drops out features
    shapes = _shapes_judged(F.linear, [(x, weight, bias)], "extreme", reference=F.linear)
    rows = ROWS_ELEMENTS // ROWS
    assert shapes == ((rows, ROWS), (ROWS, ROWS), (ROWS,))


def test_attention_cuts_its_heads_in_every_argument():
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v

    q, k, v = (_large(16, 128, 64) for _ in range(3))
    shapes = _shapes_judged(attention, [(q, k, v)], "extreme", reference=attention)
    heads = max(2, ROWS_ELEMENTS // (128 * 64))
    assert shapes == ((heads, 128, 64),) * 3


def test_a_lookup_whose_table_is_the_largest_tensor_is_judged_whole():
    def lookup(weight, index):
        return F.embedding(index, weight)

    index = torch.arange(ROWS - 1, -1, -1)  # every row of the table, the last first: no cut keeps them all
    shapes = _shapes_judged(lookup, [(_large(ROWS, WIDTH), index)], "extreme", reference=lookup)
    assert shapes == ((ROWS, WIDTH), (ROWS,))


def test_an_index_into_another_dim_keeps_its_values():
    def permute_columns(x, order):
        return x[:, order]

    order = torch.randperm(300, generator=torch.Generator().manual_seed(1))  # all below the 1024 rows, yet no row
    for check in ("extreme", "noncontiguous"):
        outcome = _one(permute_columns, [(_large(1024, 300), order)], check, reference=permute_columns)
        assert outcome.status == "passed", outcome.detail


def test_an_op_that_reduces_over_the_rows_is_judged_whole_and_its_overflow_is_caught():
    def batch_rms(x):  # float16 squares summed over 65536 rows overflow at max |x| = 6; over 512 they do not
        return ((x * x).sum(0) / x.shape[0]).sqrt()

    x = (_large(65536, 32) * 0.2).half()
    outcome = _one(batch_rms, [(x,)], "extreme", reference=lambda x: x.pow(2).mean(0).sqrt())
    assert outcome.status == "failed"
    assert "in float16 for inputs scaled to max |x| = 6" in outcome.detail
    assert "judged on the first" not in outcome.detail


def test_an_op_that_normalizes_over_the_rows_is_judged_whole():
    def batch_norm(x):  # keeps the rows, but every one depends on all of them
        return (x - x.mean(0)) / x.std(0)

    shapes = _shapes_judged(batch_norm, [(_large(ROWS, WIDTH),)], "mutation")
    assert shapes == ((ROWS, WIDTH),)


def test_an_op_counting_rows_from_an_int_argument_is_judged_whole():
    def mean_rows(x, n_rows):
        return x.sum(0) / n_rows

    shapes = _shapes_judged(mean_rows, [(_large(ROWS, WIDTH), ROWS)], "extreme", reference=lambda x, n: x.mean(0))
    assert shapes == ((ROWS, WIDTH),)


def test_a_reference_written_for_the_sample_size_alone_keeps_the_sample_whole():
    positions = _large(2 * ROWS, 64)

    def add_positions(x):
        return torch.tanh(x + positions[: x.shape[0]])

    def reference(x):  # written for the sample: any other number of rows raises
        return torch.tanh(x + positions)

    outcome = _one(add_positions, [(_large(2 * ROWS, 64),)], "extreme", reference=reference)
    assert outcome.status == "passed", outcome.detail


def test_a_branch_on_the_batch_size_through_the_same_operations_with_other_arguments_is_judged_whole():
    def softmax(x):  # large batches take one max for the whole batch, which overflows at 2e9
        m = (x.amax() if x.shape[0] >= 256 else x.amax(-1, keepdim=True)).detach()
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)

    outcome = _one(softmax, [(_large(ROWS, WIDTH),)], "extreme", reference=softmax_reference)
    assert outcome.status == "failed"
    assert "judged on the first" not in outcome.detail


def test_an_op_that_returns_nothing_on_fewer_rows_is_judged_whole():
    def whole_blocks(x):  # one output per block of 128 rows: none on fewer
        return [torch.tanh(block) for block in x.split(128) if block.shape[0] == 128]

    for check in ("extreme", "growth", "noncontiguous"):
        outcome = _one(whole_blocks, [(_large(ROWS, WIDTH),)], check)
        assert outcome.status == "passed", (check, outcome.detail)


def test_growth_still_catches_a_list_on_the_class_on_a_large_sample_and_names_the_rows():
    outcome = _one(ExpHistoryOnClass.apply, [(_large(ROWS, WIDTH) / 4,)], "growth")
    ExpHistoryOnClass.history.clear()
    assert outcome.status == "failed"
    assert "every call leaves more tensors alive: 1 tensor (about 64.0 KiB) per call" in outcome.detail
    assert f"sample 0: judged on the first {CUT} of the {ROWS} rows (dim 0) of `x`" in outcome.detail


def test_growth_passes_a_correct_op_on_a_large_sample():
    outcome = _one(torch.exp, [(_large(ROWS, WIDTH) / 4,)], "growth")
    assert outcome.status == "passed", outcome.detail


def test_noncontiguous_still_catches_a_kernel_reading_memory_as_contiguous_on_a_large_sample():
    x, weight, bias = _large(ROWS, WIDTH), _large(16, WIDTH), _large(16)
    outcome = _one(LinearContiguousAssumption.apply, [(x, weight, bias)], "noncontiguous")
    assert outcome.status == "failed"
    assert "gradient w.r.t. `weight` differs from the contiguous run when `input` is transposed" in outcome.detail
    assert f"judged on the first {CUT} of the {ROWS} rows (dim 0) of `input`, each row whole" in outcome.detail


def test_noncontiguous_passes_a_correct_linear_layer_on_a_large_sample():
    x, weight, bias = _large(ROWS, WIDTH), _large(16, WIDTH), _large(16)
    outcome = _one(LinearFunction.apply, [(x, weight, bias)], "noncontiguous")
    assert outcome.status == "passed", outcome.detail


LARGE_BATCH_ONLY_BUGS = """
import pytest, torch
from reference_ops.transforms import NaiveSoftmax, softmax_reference


def softmax(x):  # right on small batches; large ones go to a kernel that overflows
    return NaiveSoftmax.apply(x) if x.shape[0] >= 512 else torch.softmax(x, -1)


def stash_large(x):  # writes into its input, but only on large batches
    if x.shape[0] >= 512:
        x.data.mul_(1.0)
        x.data[0, 0] += 1.0
    return torch.tanh(x)


@pytest.mark.autograd_op(op=softmax, reference=softmax_reference, checks=["extreme"])
def test_softmax():
    return [(torch.randn(512, 1024),)]


@pytest.mark.autograd_op(op=stash_large, reference=torch.tanh, checks=["mutation"])
def test_stash():
    return [(torch.randn(512, 1024),)]
"""


def test_under_pytest_bugs_only_on_large_batches_still_fail_every_item(pytester, run_pytest):
    pytester.makepyfile(test_ops=LARGE_BATCH_ONLY_BUGS)
    result = run_pytest("--autograd-checks=extreme,mutation")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines_random([
        "*output is NaN in float32 for inputs scaled to max |x| = 177.446*",
        "*forward modified its argument `x` in place without declaring it*",
    ])


def test_a_mutation_on_every_batch_is_caught_on_the_first_rows_and_the_report_names_them():
    def stash(x):
        x.data[0, 0] += 1.0
        return torch.tanh(x)

    outcome = _one(stash, [(_large(ROWS, WIDTH),)], "mutation")
    assert outcome.status == "failed"
    assert f"forward modified its argument `x` in place without declaring it: 1 of {CUT * WIDTH} elements" \
        in outcome.detail
    assert f"judged on the first {CUT} of the {ROWS} rows (dim 0) of `x`, each row whole" in outcome.detail


def test_the_first_rows_are_judged_in_the_dtype_planned_for_the_whole_sample():
    from reference_ops.domain_edges import Float32Sqrt  # computes in float32 whatever it is given

    x = torch.rand(ROWS, WIDTH, generator=torch.Generator().manual_seed(0)) + 0.1
    outcome = _one(Float32Sqrt.apply, [(x,)], "grad_metadata")
    assert outcome.status == "passed", outcome.detail


def test_a_branch_on_the_batch_size_through_a_constant_made_inside_the_op_is_judged_whole():
    def prescaled(x):  # large batches pre-scale by a constant that overflows at 2e9
        scale = torch.tensor(1e30 if x.shape[0] >= ROWS else 1.0)
        return (x * scale) / scale

    outcome = _one(prescaled, [(_large(ROWS, WIDTH),)], "extreme", reference=lambda x: x * 1.0)
    assert outcome.status == "failed"
    assert "judged on the first" not in outcome.detail


def test_an_index_into_the_rows_cut_away_refuses_the_cut_before_the_op_reads_out_of_range():
    from pytest_autograd.checks._fewer_rows import _Called

    rows, index = _large(16, 4), torch.tensor([3, 20])
    with pytest.raises(IndexError, match="aten.index_select.default: index 20 out of range for a dim of 16"):
        with _Called(set()):
            torch.index_select(rows, 0, index)
    with pytest.raises(IndexError, match="aten.index.Tensor: index 20 out of range for a dim of 16"):
        with _Called(set()):
            rows[index]


def test_message_passing_over_rows_gathered_by_index_is_judged_whole():
    def message_passing(x, edges):
        return torch.zeros_like(x).index_add(0, edges[1], x[edges[0]])

    edges = torch.randint(0, ROWS, (2, 4000), generator=torch.Generator().manual_seed(1))
    shapes = _shapes_judged(message_passing, [(_large(ROWS, 64), edges)], "mutation")
    assert shapes == ((ROWS, 64), (2, 4000))


def test_an_op_raising_on_the_first_rows_is_reported_with_the_rows():
    calls = [0]

    def runs_out(x):
        calls[0] += 1
        if calls[0] > 6:
            raise RuntimeError(f"workspace exhausted for a batch of {x.shape[0]} rows")
        return x.tanh()

    outcome = _one(runs_out, [(_large(ROWS, WIDTH),)], "growth")
    assert outcome.status == "failed"
    assert f"workspace exhausted for a batch of {CUT} rows" in outcome.detail
    assert f"judged on the first {CUT} of the {ROWS} rows (dim 0) of `x`" in outcome.detail


def test_a_one_dimensional_sample_is_cut_to_its_first_elements():
    def stash(x):
        x.data[0] += 1.0
        return torch.tanh(x)

    outcome = _one(stash, [(_large(4 * ROWS_ELEMENTS),)], "mutation")
    assert outcome.status == "failed"
    assert f"judged on the first {ROWS_ELEMENTS} of the {4 * ROWS_ELEMENTS} elements of `x`" in outcome.detail
