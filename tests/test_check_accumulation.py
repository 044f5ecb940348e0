"""The accumulation check runs two micro-batches' backwards: .grad must hold the sum of their gradients."""

import textwrap

import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.training import ScaleColumns, columns_samples

HINT = "*hint: return every gradient in a new tensor*never a buffer kept across calls or a view of one*"


def run(pytester, run_pytest, op):
    pytester.makepyfile(test_ops=textwrap.dedent(f"""
        import pytest, torch
        from reference_ops.training import {op}, columns_samples

        @pytest.mark.autograd_op(op={op})
        def test_op():
            return columns_samples(torch.Generator().manual_seed(0))
    """))
    return run_pytest("--autograd-checks=accumulation")


def test_accumulation_fails_a_backward_returning_a_view_of_a_buffer_it_reuses(pytester, run_pytest):
    result = run(pytester, run_pytest, "ScaleColumnsGradIntoBufferView")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*after two micro-batches, .grad of `w` is not the sum of their gradients",
        "*check accumulation, device cpu, dtype float32, sample 0",
        "*argument: w",
        "*worst element: grad w[[]*[]]: sum *, .grad *",
        "*the first micro-batch's backward ran into an empty .grad, the second's into the first's result*",
        "*the gradient the first backward returned changed when the second ran: torch kept it as .grad, and the op "
        "wrote the second one's over it",
        HINT,
    ])


def test_accumulation_fails_a_backward_returning_the_buffer_itself(pytester, run_pytest):
    result = run(pytester, run_pytest, "ScaleColumnsReturnsGradBuffer")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the second backward changed the gradient w.r.t. `w` that the first one returned",
        "*worst element: grad w[[]*[]]: as returned *, after the second backward *",
        "*both backwards ran with torch.autograd.grad on the same inputs*it is a buffer the op reuses across calls",
        HINT,
    ])


def test_gradients_in_new_tensors_accumulate_and_pass():
    (outcome,) = run_checks(ScaleColumns, samples=columns_samples(), checks=["accumulation"])
    assert outcome.status == "passed", outcome.detail


def test_a_backward_passing_grad_output_through_as_the_gradient_passes():
    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad  # the caller's cotangent itself: torch copies it into .grad, which is right

    (outcome,) = run_checks(Identity, torch.randn(4, 3), checks=["accumulation"])
    assert outcome.status == "passed", outcome.detail


def test_an_op_whose_gradient_changes_from_call_to_call_is_noted_not_judged():
    class GrowsEveryCall(torch.autograd.Function):
        calls = 0

        @staticmethod
        def forward(ctx, x):
            GrowsEveryCall.calls += 1
            ctx.scale = float(GrowsEveryCall.calls)
            return x * ctx.scale

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.scale

    (outcome,) = run_checks(GrowsEveryCall, torch.randn(4, 3), checks=["accumulation"])
    assert outcome.status == "passed", outcome.detail
    assert "accumulation: not judged over two micro-batches: two plain runs of the op from one seed" in outcome.detail
