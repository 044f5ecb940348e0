"""The checkpoint check runs the op under torch.utils.checkpoint: the recompute must be the first forward."""

import textwrap

import pytest
import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.random_ops import Dropout, dropout_samples
from reference_ops.training import CountsCalls, samples

HINT = "*hint: checkpoint runs forward again during backward and expects it to compute the same*"


def run(pytester, run_pytest, op):
    pytester.makepyfile(test_ops=textwrap.dedent(f"""
        import pytest, torch
        from reference_ops.training import {op}, samples

        @pytest.mark.autograd_op(op={op})
        def test_op():
            return samples(torch.Generator().manual_seed(0))
    """))
    return run_pytest("--autograd-checks=checkpoint")


@pytest.mark.parametrize("op, source", [
    ("DropoutOwnGenerator", "a torch.Generator of its own"),
    ("NoiseFromNumpy", "numpy's global generator"),
    ("AnnealedByStepCount", "a step counter"),
])
def test_checkpoint_fails_a_forward_whose_recompute_computes_something_else(pytester, run_pytest, op, source):
    result = run(pytester, run_pytest, op)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*under checkpoint(use_reentrant=False) the forward recomputed during backward differs from the first "
        "forward: output changed",
        "*check checkpoint, device cpu, dtype float32, sample 0",
        "*worst element: output[[]*[]]: first forward *, recompute *",
        "*backward differentiates the recomputed forward, so the gradients are not those of the output the loss was "
        "computed from",
        HINT + "draw random numbers from torch's global generator (checkpoint restores its state for the recompute)*",
    ])


def test_checkpoint_fails_a_recompute_that_saves_other_shapes_naming_torchs_recompute_check(pytester, run_pytest):
    result = run(pytester, run_pytest, "TokenDropOwnGenerator")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*under checkpoint(use_reentrant=False) torch's recompute check failed: the forward recomputed during "
        "backward saved other tensors than the first forward",
        "*CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different "
        "metadata than during the forward pass. tensor at position 0: saved metadata: {'shape': torch.Size([[]*[]])*",
        HINT,
    ])


def test_a_dropout_on_torchs_global_generator_and_a_harmless_counter_pass_under_checkpoint():
    assert run_checks(Dropout, samples=dropout_samples(), checks=["checkpoint"])[0].status == "passed"
    before = CountsCalls.calls
    (outcome,) = run_checks(CountsCalls, samples=samples(), checks=["checkpoint"])
    assert outcome.status == "passed", outcome.detail
    assert CountsCalls.calls > before


class ScaleByCallsBackwardCounts(torch.autograd.Function):
    """A counter advanced in backward scales the next forward: every plain run differs from the one before."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        scale = 1.0 + ScaleByCallsBackwardCounts.calls
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        ScaleByCallsBackwardCounts.calls += 1
        return grad * ctx.scale


def test_an_op_whose_plain_runs_differ_from_call_to_call_is_noted_not_judged():
    (outcome,) = run_checks(ScaleByCallsBackwardCounts, samples=samples(), checks=["checkpoint"])
    assert outcome.status == "passed", outcome.detail
    assert ("checkpoint: not judged against the plain run under checkpoint(use_reentrant=False): two plain runs "
            "of the op from one seed") in outcome.detail


def test_an_op_that_raises_only_under_the_reentrant_checkpoint_is_noted_with_the_error():
    class ForwardRefusesNoGrad(torch.autograd.Function):
        """Raises when its forward runs without grad mode, as the reentrant checkpoint's first forward does."""

        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, grad):
            return grad * 3

    def op(x):
        if not torch.is_grad_enabled():
            raise RuntimeError("this kernel needs autograd enabled (it records its own graph)")
        return ForwardRefusesNoGrad.apply(x)

    (outcome,) = run_checks(op, samples=samples(), checks=["checkpoint"])
    assert outcome.status == "passed", outcome.detail
    assert ("checkpoint: not judged under checkpoint(use_reentrant=True): the op's forward raises there "
            "(RuntimeError: this kernel needs autograd enabled") in outcome.detail


def test_checkpoint_fails_a_backward_that_raises_only_when_its_saved_tensors_are_recomputed():
    class ChecksSavedIdentity(torch.autograd.Function):
        """Numbers the tensor it saves and refuses another: a recompute hands back a new tensor, numbered by the
        recompute's own forward. (A number, not the address: a recompute may land where the freed original was.)"""

        calls = 0

        @staticmethod
        def forward(ctx, x):
            ChecksSavedIdentity.calls += 1
            y = x * 2
            y.serial = ctx.serial = ChecksSavedIdentity.calls
            ctx.save_for_backward(y)
            return y.sin()

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            if getattr(y, "serial", None) != ctx.serial:
                raise RuntimeError("saved buffer moved")
            return grad * y.cos() * 2

    (outcome,) = run_checks(ChecksSavedIdentity, samples=samples(), checks=["checkpoint"])
    assert outcome.status == "failed"
    assert ("the op's backward raised RuntimeError under checkpoint(use_reentrant=False), though it runs plainly: "
            "saved buffer moved") in outcome.detail


def test_a_recompute_that_only_the_reentrant_form_runs_is_judged_there():
    """An op that saves no tensor is not recomputed by the non-reentrant form, whose backward then uses forward's
    own ctx; the reentrant form recomputes it, and backward differentiates the recompute."""
    import random

    class ScaleFromPythonsRandom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.scale = 1 + 0.1 * random.random()
            return x * ctx.scale

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.scale

    (outcome,) = run_checks(ScaleFromPythonsRandom, samples=samples(), checks=["checkpoint"])
    assert outcome.status == "failed", outcome.detail
    assert ("under checkpoint(use_reentrant=True) the forward recomputed during backward differs from the first "
            "forward: output changed") in outcome.detail
