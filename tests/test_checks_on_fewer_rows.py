"""extreme and growth judge a large sample on its first rows, each row whole, and still catch what they catch."""

import torch
import torch.nn.functional as F

from pytest_autograd.checks._fewer_rows import ROWS_ELEMENTS
from pytest_autograd.engine.api import run_checks
from reference_ops.state import ExpHistoryOnClass
from reference_ops.transforms import NaiveSoftmax, StableSoftmax, softmax_reference

ROWS, WIDTH = 512, 1024  # 512k elements: over ROWS_ELEMENTS
CUT = ROWS_ELEMENTS // WIDTH  # the rows kept


def _large(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _one(op, samples, check, **options):
    (outcome,) = run_checks(op, samples=samples, checks=[check], **options)
    return outcome


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

    op = ShapesSeen(kernel_for_large_batches)
    outcome = _one(op, [(_large(ROWS, WIDTH),)], "extreme", reference=torch.tanh)
    assert outcome.status == "passed", outcome.detail
    assert op.calls[-1] == ((ROWS, WIDTH),)


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

    op = ShapesSeen(fixed_batch)
    outcome = _one(op, [(_large(ROWS, WIDTH),)], "extreme")
    assert outcome.status == "passed", outcome.detail
    assert op.calls[-1] == ((ROWS, WIDTH),)


def test_a_target_per_row_is_cut_with_the_rows_it_belongs_to():
    def loss(logits, target):
        return F.cross_entropy(logits, target)

    op = ShapesSeen(loss)
    target = torch.randint(0, WIDTH, (ROWS,), generator=torch.Generator().manual_seed(1))
    outcome = _one(op, [(_large(ROWS, WIDTH), target)], "extreme", reference=loss)
    assert outcome.status == "passed", outcome.detail
    assert op.calls[-1] == ((CUT, WIDTH), (CUT,))


def test_a_square_layer_cuts_the_rows_of_weight_and_bias_that_share_the_batch_size():
    op = ShapesSeen(F.linear)  # x (512, 512) and weight (512, 512): dim 0 of both, then of the bias, is 512
    x, weight, bias = _large(ROWS, ROWS), _large(ROWS, ROWS), _large(ROWS)
    outcome = _one(op, [(x, weight, bias)], "extreme", reference=F.linear)
    assert outcome.status == "passed", outcome.detail
    rows = ROWS_ELEMENTS // ROWS
    assert op.calls[-1] == ((rows, ROWS), (rows, ROWS), (rows,))


def test_indices_into_a_cut_table_are_taken_modulo_its_new_size():
    def lookup(weight, index):
        return F.embedding(index, weight)

    op = ShapesSeen(lookup)
    index = torch.arange(ROWS - 1, -1, -1)  # every row of the table, the last first
    outcome = _one(op, [(_large(ROWS, WIDTH), index)], "extreme", reference=lookup)
    assert outcome.status == "passed", outcome.detail
    assert op.calls[-1] == ((CUT, WIDTH), (ROWS,))


def test_growth_still_catches_a_list_on_the_class_on_a_large_sample_and_names_the_rows():
    outcome = _one(ExpHistoryOnClass.apply, [(_large(ROWS, WIDTH) / 4,)], "growth")
    ExpHistoryOnClass.history.clear()
    assert outcome.status == "failed"
    assert "every call leaves more tensors alive: 1 tensor (about 256.0 KiB) per call" in outcome.detail
    assert f"sample 0: judged on the first {CUT} of the {ROWS} rows (dim 0) of `x`" in outcome.detail


def test_growth_passes_a_correct_op_on_a_large_sample():
    outcome = _one(torch.exp, [(_large(ROWS, WIDTH) / 4,)], "growth")
    assert outcome.status == "passed", outcome.detail
