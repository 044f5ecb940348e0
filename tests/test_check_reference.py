"""reference: outputs and gradients match reference= in float64 and in the sample's own dtype."""

import torch

HEADER = """
import pytest
import torch
import torch.nn.functional as F
from reference_ops import (
    AddOneInPlace, KillHead, LinearFunction, MulConstant, RNNCell, SortWithIndices, SplitHalves,
    add_one_reference, kill_head_reference, mul_constant_reference, rnn_cell_reference, rnn_cell_samples,
    sort_reference, sort_samples, split_halves_reference,
)
from reference_ops.buggy import LinearWeightGradTransposed, RNNCellMissingTanhDerivative
"""


def run_reference(pytester, run_pytest, body, *args):
    pytester.makepyfile(test_ops=HEADER + body)
    return run_pytest("--autograd-checks=reference", "-rs", *args)


def test_rnn_cell_missing_tanh_derivative_differs_from_the_reference(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=RNNCellMissingTanhDerivative, reference=rnn_cell_reference)
def test_rnn_cell():
    return rnn_cell_samples()
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` from the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "  argument: x",
        "  worst element: grad x[[]*]: expected *, got *",
        "  max abs error *, max rel error * (atol *, rtol 1e-07); * of 12 elements differ",
    ], consecutive=True)


def test_a_wrong_reference_is_caught_too(pytester, run_pytest):
    # The op is right; the reference forgets the tanh. The check cannot know
    # which side is wrong, so it says where they disagree.
    result = run_reference(pytester, run_pytest, """
def rnn_cell_without_tanh(x, h, w_ih, w_hh, b_ih, b_hh):
    return x @ w_ih.T + b_ih + h @ w_hh.T + b_hh

@pytest.mark.autograd_op(op=RNNCell, reference=rnn_cell_without_tanh)
def test_rnn_cell():
    return rnn_cell_samples()
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output of the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "  output: output",
    ], consecutive=True)


def test_a_transposed_square_weight_gradient_gets_a_hint(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=LinearWeightGradTransposed, reference=F.linear)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))]
""")
    result.assert_outcomes(failed=1)
    # The sample comes from the RNG the item is seeded with; the cotangent must
    # not come from the same stream, or it would equal x and x.T @ x, being
    # symmetric, would hide the transpose (the float64 pass used to pass).
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `weight` from the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "  argument: weight",
        "  worst element: grad weight[[]*]: expected *, got *",
        "  max abs error *",
        "  hint: the gradient is the transpose of the expected one",
    ], consecutive=True)


def test_correct_ops_with_none_int_and_float_arguments_pass(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=LinearFunction, reference=F.linear)
def test_linear_with_and_without_bias():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    return [(x, w, torch.randn(5)), (x, w, None), (torch.randn(2, 3, 4), w, None)]

@pytest.mark.autograd_op(op=MulConstant, reference=mul_constant_reference)
def test_mul_constant_float_argument():
    return [(torch.randn(3, 4), 2.5), (torch.randn(5), -0.5)]

@pytest.mark.autograd_op(op=KillHead, reference=kill_head_reference)
def test_kill_head_int_argument():
    return [(torch.randn(3, 5), 2)]

@pytest.mark.autograd_op(op=SplitHalves, reference=split_halves_reference)
def test_split_halves_two_outputs():
    return [(torch.randn(3, 5), 2)]

@pytest.mark.autograd_op(op=RNNCell, reference=rnn_cell_reference)
def test_rnn_cell():
    return rnn_cell_samples()
""")
    result.assert_outcomes(passed=5)


def test_an_in_place_op_with_mark_dirty_passes(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=AddOneInPlace, reference=add_one_reference)
def test_add_one():
    return [(torch.randn(3, 4),), (torch.randn(5),)]
""")
    result.assert_outcomes(passed=1)


def test_integer_outputs_pass_when_equal(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=SortWithIndices, reference=sort_reference)
def test_sort():
    return sort_samples()
""")
    result.assert_outcomes(passed=1)


def test_integer_outputs_are_compared_exactly(pytester, run_pytest):
    # Off by one in a value of a million: within any floating tolerance
    # (rtol 1e-4 allows 100), but integers must be equal.
    result = run_reference(pytester, run_pytest, """
def bucket(x):
    return x * 2, (x > 0).sum(-1) * 1_000_000

def bucket_off_by_one(x):
    return x * 2, (x > 0).sum(-1) * 1_000_000 + 1

@pytest.mark.autograd_op(op=bucket_off_by_one, reference=bucket)
def test_bucket():
    return [(torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]]),)]
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output 1 of the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "  output: output 1",
        "  worst element: output 1[[]0[]]: expected 2000000, got 2000001",
        "  compared exactly (integer/bool values); 2 of 2 elements differ",
    ], consecutive=True)


def test_the_second_pass_in_the_samples_dtype_catches_a_precision_loss(pytester, run_pytest):
    # A kernel that accumulates float32 inputs in half precision is exact in
    # float64 and wrong only in the dtype the user actually runs.
    result = run_reference(pytester, run_pytest, """
def scale_sum(x):
    return (x * 3.1).sum(-1)

def scale_sum_half_for_float32(x):
    if x.dtype == torch.float32:
        return (x.half() * 3.1).sum(-1).float()
    return (x * 3.1).sum(-1)

@pytest.mark.autograd_op(op=scale_sum_half_for_float32, reference=scale_sum)
def test_scale_sum():
    return [(torch.randn(4, 64),)]
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output of the op differs from the reference",
        "  check reference, device cpu, dtype float32, sample 0",
    ], consecutive=True)


def test_marker_tolerances_loosen_the_comparison(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
def nearly(x):
    return x * 2 + 1e-4

@pytest.mark.autograd_op(op=nearly, reference=lambda x: x * 2)
def test_strict():
    return [(torch.randn(3),)]

@pytest.mark.autograd_op(op=nearly, reference=lambda x: x * 2, atol=1e-3)
def test_loose():
    return [(torch.randn(3),)]
""", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_strict[[]reference-cpu[]] FAILED*", "*test_loose[[]reference-cpu[]] PASSED*"])


def test_without_a_reference_the_check_is_skipped(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
@pytest.mark.autograd_op(op=LinearFunction)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(5, 4), None)]
""")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no reference= on the marker"])


def test_a_reference_that_raises_is_named_as_the_reference(pytester, run_pytest):
    result = run_reference(pytester, run_pytest, """
def picky_reference(x):
    raise ValueError("only batches of 8")

@pytest.mark.autograd_op(op=torch.sin, reference=picky_reference)
def test_sin():
    return [(torch.randn(3),)]
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=picky_reference raised ValueError in its forward: only batches of 8",
        "  check reference, device cpu, dtype float64, sample 0",
        "  at *test_ops.py:* in picky_reference",
        "  hint: the reference must take the same arguments as the op and run on every sample it runs on",
    ], consecutive=True)


class SoftmaxWithUndifferentiatedLogsumexp(torch.autograd.Function):
    """BUG: the logsumexp it also returns (a z-loss input) is marked non-differentiable: its gradient is dropped."""

    @staticmethod
    def forward(ctx, x):
        lse = torch.logsumexp(x, -1)
        y = torch.exp(x - lse.unsqueeze(-1))
        ctx.save_for_backward(y)
        ctx.mark_non_differentiable(lse)
        return y, lse

    @staticmethod
    def backward(ctx, grad_y, grad_lse):
        (y,) = ctx.saved_tensors
        return y * (grad_y - (grad_y * y).sum(-1, keepdim=True))


def test_an_output_the_op_declares_non_differentiable_but_the_reference_differentiates_fails_by_name():
    from pytest_autograd.engine.api import run_checks

    (outcome,) = run_checks(SoftmaxWithUndifferentiatedLogsumexp, torch.randn(8, 64), checks=["reference"],
                            reference=lambda x: (torch.softmax(x, -1), torch.logsumexp(x, -1)))
    assert outcome.status == "failed"
    assert "output 1 of the op does not require grad, but the reference's does" in outcome.detail
    assert "mark_non_differentiable" in outcome.detail
