"""Ops the derivative checks cannot drive the usual way: backward-only ops and declared surrogates.

A reentrant checkpoint refuses torch.autograd.grad: every check drives it
with .backward() instead, and gradgradcheck skips, saying why. A
straight-through estimator is a deliberate surrogate: undeclared, gradcheck
fails naming the pattern and the option; declared with surrogate_grad=True,
the derivative checks skip and the others still judge it.
"""

HEADER = """
import pytest
import torch
from reference_ops.surrogate import *
"""


def run(pytester, run_pytest, op, reference, samples, extra="", *args):
    pytester.makepyfile(test_ops=HEADER + f"""
@pytest.mark.autograd_op(op={op}, reference={reference}{extra})
def test_op():
    return {samples}()
""")
    return run_pytest("-rs", *args)


def test_a_reentrant_checkpoint_passes_every_default_check_driven_with_backward(pytester, run_pytest):
    result = run(pytester, run_pytest, "checkpointed_block", "block_reference", "block_samples")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 10
    result.stdout.fnmatch_lines([
        "SKIPPED * the op only works with .backward() (torch.utils.checkpoint with use_reentrant=True refuses "
        "torch.autograd.grad), so its second derivative cannot be taken; use use_reentrant=False to have it checked",
    ])


def test_a_wrong_gradient_under_a_reentrant_checkpoint_still_fails_gradcheck(pytester, run_pytest):
    pytester.makepyfile(test_ops=HEADER + """
from torch.utils.checkpoint import checkpoint

class HalfGradTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y) / 2

def checkpointed(x):
    return checkpoint(HalfGradTanh.apply, x, use_reentrant=True)

@pytest.mark.autograd_op(op=checkpointed)
def test_op():
    return [(torch.randn(3, 4),)]
""")
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of output w.r.t. `x` does not match the numerical derivative",
                                 "*hint: the analytical gradient is half the numerical one*"])


def test_an_undeclared_straight_through_estimator_fails_gradcheck_naming_the_pattern_and_the_option(
        pytester, run_pytest):
    result = run(pytester, run_pytest, "SignStraightThrough", "sign_straight_through_reference", "sign_samples", "",
                 "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `x` does not match the numerical derivative",
        "*hint: the output does not move when `x` moves (numerical derivative exactly 0) but backward passes a "
        "gradient: if that is a deliberate surrogate (a straight-through estimator for sign, round or a "
        "quantiser), declare it with surrogate_grad=True on the marker*",
    ])


def test_a_declared_straight_through_estimator_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, "SignStraightThrough", "sign_straight_through_reference", "sign_samples",
                 ", surrogate_grad='straight-through estimator, 1 inside [-1, 1]'")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "SKIPPED * surrogate_grad= on the marker: backward is a declared surrogate (straight-through estimator, "
        "1 inside *), not the derivative, so gradcheck cannot judge it; reference and the hygiene checks "
        "still run",
    ])


def test_a_declared_surrogate_with_the_wrong_range_fails_the_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, "SignStraightThroughNoRange", "sign_straight_through_reference",
                 "sign_samples", ", surrogate_grad=True", "--autograd-checks=gradcheck,reference")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `x` from the op differs from the reference"])


def test_surrogate_grad_takes_true_or_a_description(pytester, run_pytest):
    result = run(pytester, run_pytest, "SignStraightThrough", "sign_straight_through_reference", "sign_samples",
                 ", surrogate_grad=3", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*surrogate_grad= must be True or a short description of the surrogate*"])
