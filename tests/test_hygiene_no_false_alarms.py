"""Every correct op passes every hygiene check: no false alarms.

One in-process run of the seven hygiene checks, through the marker, over
every correct op in ``reference_ops.EXAMPLES`` plus a few more shapes of op
(plain functions, torch.ops, channels-last convolution, a backward that
returns gradients nobody asked for). Hygiene warnings are errors here, so a
correct op may not even warn.
"""

import textwrap

HYGIENE = ["mutation", "requires_grad", "undefined_grad", "noncontiguous", "determinism", "grad_metadata", "leak",
           "growth", "aliasing", "reentrancy", "rng"]

OPS = """
import pytest, torch
import torch.nn.functional as F
from reference_ops import EXAMPLES

HYGIENE = {hygiene!r}


def _example_test(name, example):
    @pytest.mark.autograd_op(op=example.function, checks=HYGIENE)
    def test():
        return example.samples(generator=torch.Generator().manual_seed(0))

    return test


for _name, _example in EXAMPLES.items():
    globals()[f"test_{{_name}}"] = _example_test(_name, _example)


class MulReturnsEveryGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad * b, grad * a     # even for an input that needs no grad


@pytest.mark.autograd_op(op=MulReturnsEveryGrad, checks=HYGIENE)
def test_backward_returning_unneeded_grads():
    return [(torch.randn(3, 4), torch.randn(3, 4))]


def conv(x, w, padding):
    return F.conv2d(x, w, padding=padding)


@pytest.mark.autograd_op(op=conv, checks=HYGIENE)
def test_plain_function_with_non_tensor_argument():
    return [(torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), 1)]


@pytest.mark.autograd_op(op=torch.ops.aten.mm.default, checks=HYGIENE)
def test_aten_op():
    return [(torch.randn(3, 4), torch.randn(4, 2))]


@pytest.mark.autograd_op(op=torch.topk, checks=HYGIENE)
def test_multi_output_with_integer_indices():
    return [(torch.randn(3, 6), 2)]
"""

EXTRA_TESTS = 4


def test_hygiene_checks_raise_no_false_alarm_on_any_correct_op(pytester, run_pytest):
    from reference_ops import EXAMPLES

    pytester.makepyfile(test_ops=textwrap.dedent(OPS.format(hygiene=HYGIENE)))
    result = run_pytest("-rfs", "-W", "error::pytest_autograd.checks._hygiene.HygieneWarning")
    outcomes = result.parseoutcomes()
    items = (len(EXAMPLES) + EXTRA_TESTS) * len(HYGIENE)
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes.get("skipped", 0) == 0, result.stdout.str()  # one input: requires_grad judges its inference path
    assert outcomes.get("passed", 0) == items
