"""The checks that compare the op with itself share one plain run per sample, and judge the same with or without it.

determinism, aliasing, reentrancy, growth and rng each start from a plain
forward and backward of the sample (``checks/_plain_run``); the first of them
makes it, the others find it. Run alone, a check makes it itself: its verdict
must not depend on which check came first.
"""

import pytest
import torch

from pytest_autograd import run_checks
from test_shared_derivative_work import _counting
from reference_ops.state import (
    ExpHistoryOnClass,
    ExpKeepsDetachedOutput,
    NoisyScaleReseedsGlobalRng,
    SquareAccumulatesGradBuffer,
    SquareSavesOnCtx,
    SquareStashesInputOnClass,
)

SHARING = ["determinism", "aliasing", "reentrancy", "growth", "rng"]


def _samples():
    return [(torch.randn(4, 5, generator=torch.Generator().manual_seed(3)),)]


def test_the_checks_that_compare_the_op_with_itself_run_its_plain_run_once_between_them():
    alone = 0
    for check in SHARING:
        op, counts = _counting(SquareSavesOnCtx)
        assert run_checks(op, samples=_samples(), checks=[check])[0].status == "passed"
        alone += counts["forward"]
    op, counts = _counting(SquareSavesOnCtx)
    outcomes = run_checks(op, samples=_samples(), checks=SHARING)
    assert [o.status for o in outcomes] == ["passed"] * len(SHARING)
    assert counts["forward"] == alone - (len(SHARING) - 1)


@pytest.mark.parametrize("op, check", [
    (SquareStashesInputOnClass, "reentrancy"),
    (SquareAccumulatesGradBuffer, "reentrancy"),
    (ExpKeepsDetachedOutput, "aliasing"),
    (ExpHistoryOnClass, "growth"),
    (NoisyScaleReseedsGlobalRng, "rng"),
])
def test_a_planted_bug_fails_the_same_alone_and_after_another_check_made_the_plain_run(op, check):
    alone = [o for o in run_checks(op, samples=_samples(), checks=[check])]
    shared = [o for o in run_checks(op, samples=_samples(), checks=["determinism", check]) if o.check == check]
    assert alone[0].status == shared[0].status == "failed"
    assert alone[0].detail.splitlines()[0] == shared[0].detail.splitlines()[0]


def test_determinism_compares_its_own_run_with_a_copy_of_the_plain_run_not_a_buffer_the_op_reuses():
    class ScaleIntoReusedBuffer(torch.autograd.Function):
        """Writes every output into one buffer it keeps: the caller's earlier output changes under it."""

        buffer = None
        calls = 0

        @staticmethod
        def forward(ctx, x):
            ScaleIntoReusedBuffer.calls += 1
            if ScaleIntoReusedBuffer.buffer is None or ScaleIntoReusedBuffer.buffer.shape != x.shape:
                ScaleIntoReusedBuffer.buffer = torch.empty_like(x)
            # the result drifts from call to call (a race, in a real kernel); the buffer hides it from a comparison
            # of two outputs that are the same memory
            return torch.mul(x, 2 + 1e-3 * ScaleIntoReusedBuffer.calls, out=ScaleIntoReusedBuffer.buffer)

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    outcome = run_checks(ScaleIntoReusedBuffer, samples=_samples(), checks=["determinism"])[0]
    assert outcome.status == "failed"
    assert "two runs on the same inputs differ: output" in outcome.detail


@pytest.mark.parametrize("check", ["determinism", "reentrancy"])
def test_a_backward_that_writes_into_what_it_was_given_is_left_to_mutation_whatever_ran_before(check):
    # The plain run hands every check fresh cotangents and keeps outputs as read after backward, where a check that
    # ran the op itself read them: a backward writing into grad_output or into the op's output is mutation's
    # finding, and the checks that compare runs judge the same alone and after the others.
    from reference_ops.buggy import ScaleMutatesGradOutput
    from reference_ops.state import ExpBackwardWritesOutput

    for op in (ScaleMutatesGradOutput, ExpBackwardWritesOutput):
        alone = run_checks(op, samples=_samples(), checks=[check])[0]
        others_first = [name for name in SHARING if name != check] + [check]
        after = [o for o in run_checks(op, samples=_samples(), checks=others_first) if o.check == check][0]
        assert alone.status == after.status, (op.__name__, alone.detail, after.detail)
        assert alone.detail.splitlines()[:1] == after.detail.splitlines()[:1]
        assert run_checks(op, samples=_samples(), checks=["mutation"])[0].status == "failed"
        if check == "determinism" or op is ExpBackwardWritesOutput:
            assert alone.status == "passed", (op.__name__, alone.detail)
