"""Every wrong argument is named, and each hint fires only when the evidence shows its pattern.

For each hint: an op whose failure has the pattern (the hint is there) and
one whose failure does not (the hint is not), so a hint cannot fire on a
coincidence of the worst element.
"""

import pytest
import torch

from pytest_autograd import run_checks
from reference_ops.buggy import LinearGradInputWrong, RNNCellMissingTanhDerivative


def report_of(op, *args, check="gradcheck", **options):
    (outcome,) = run_checks(op, *args, checks=[check], shrink=0, **options)
    assert outcome.status == "failed", outcome.detail
    return outcome.detail


def scaled_backward(name, scale):
    """``x * 1.5`` whose backward multiplies the gradient by ``scale(x)`` (a tensor of factors)."""

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 1.5 * scale(x)

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1.5

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


NEGATED = scaled_backward("Negated", lambda x: -torch.ones_like(x))
NEGATED_AT_ONE = scaled_backward("NegatedAtOne", lambda x: torch.ones_like(x).flatten().index_fill(0, torch.tensor([0]), -1.0).reshape(x.shape))
DOUBLED = scaled_backward("Doubled", lambda x: 2 * torch.ones_like(x))
DOUBLED_OR_TRIPLED = scaled_backward("DoubledOrTripled", lambda x: torch.where(torch.arange(x.numel()).reshape(x.shape) % 2 == 0, 2.0, 3.0).to(x.dtype))
TWO_WRONG = scaled_backward("TwoWrong", lambda x: torch.ones_like(x).flatten().index_fill(0, torch.tensor([0, 3]), 1.2).reshape(x.shape))
ONE_WRONG = scaled_backward("OneWrong", lambda x: torch.ones_like(x).flatten().index_fill(0, torch.tensor([3]), 1.2).reshape(x.shape))

SMALL, LARGE = (3, 4), (48, 32)  # the full Jacobian, and whole-input probes


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_every_wrong_argument_is_named_with_its_own_worst_element(shape):
    batch, features = shape[0] // 3 or 1, shape[1] // 4 or 1
    sizes = [(batch, features), (batch, 2 * features), (2 * features, features), (2 * features, 2 * features),
             (2 * features,), (2 * features,)]
    args = [torch.randn(*size) for size in sizes]
    detail = report_of(RNNCellMissingTanhDerivative, *args)
    first = detail.split("w.r.t. `")[1].split("`")[0]
    named = {first} | {line.split("`")[1] for line in detail.splitlines() if line.startswith("  also w.r.t. `")}
    assert named == {"x", "h", "w_ih", "w_hh", "b_ih", "b_hh"}, detail
    for line in detail.splitlines():
        if line.startswith("  also w.r.t. `"):
            name = line.split("`")[1]
            assert f" {name}[" in line and "expected" in line and "> tolerance" in line, line


def test_the_reference_check_names_every_wrong_gradient_too():
    from reference_ops import rnn_cell_reference

    args = [torch.randn(*size) for size in [(3, 4), (3, 5), (5, 4), (5, 5), (5,), (5,)]]
    detail = report_of(RNNCellMissingTanhDerivative, *args, check="reference", reference=rnn_cell_reference)
    also = [line.split("`")[1] for line in detail.splitlines() if line.startswith("  also w.r.t. `")]
    assert len(also) == 5 and all(f"grad {name}[" in detail for name in also), detail


def test_a_right_argument_is_not_named():
    detail = report_of(LinearGradInputWrong, torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))
    assert "w.r.t. `input`" in detail and "also" not in detail  # weight and bias gradients are right


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_the_sign_hint_needs_every_element_negated(shape):
    x = torch.rand(*shape) + 0.5
    assert "hint: the analytical gradient has the wrong sign at every element of `x`" in report_of(NEGATED, x)
    assert "wrong sign" not in report_of(NEGATED_AT_ONE, x)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_the_factor_hint_needs_one_factor_at_every_element(shape):
    x = torch.randn(*shape)
    assert "hint: the analytical gradient is twice the numerical one at every element of `x`: a constant factor " \
           "is off" in report_of(DOUBLED, x)
    assert "constant factor" not in report_of(DOUBLED_OR_TRIPLED, x)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_the_single_element_hint_needs_every_other_element_right(shape):
    x = torch.randn(*shape)
    assert "hint: only grad x[0, 3] is wrong; every other element of `x`'s gradient matches" in report_of(ONE_WRONG, x)
    assert "only grad" not in report_of(TWO_WRONG, x)


def test_the_non_finite_hint_needs_a_finite_numerical_derivative():
    class NanGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * torch.nan

    assert "hint: backward produced inf/NaN where the numerical derivative is finite" in report_of(
        NanGradient, torch.randn(2, 3))
    # sqrt of a negative input is NaN both ways: the numerical derivative is not finite, so no such hint.
    detail = run_checks(torch.sqrt, torch.tensor([4.0, -1.0]), checks=["gradcheck"], shrink=0)[0].detail
    assert "numerical derivative is finite" not in detail


def test_the_transpose_hint_needs_a_transposed_gradient():
    from reference_ops.buggy import LinearWeightGradTransposed

    square = (torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))
    hint = "the gradient is the transpose of the expected one"
    assert hint in report_of(LinearWeightGradTransposed, *square, check="reference",
                             reference=torch.nn.functional.linear)
    assert hint not in report_of(LinearGradInputWrong, torch.randn(4, 4), torch.randn(4, 4), torch.randn(4),
                                 check="reference", reference=torch.nn.functional.linear)


def test_the_all_zeros_hint_needs_an_all_zero_gradient():
    hint = "the gradient is all zeros"
    zero = scaled_backward("Zero", torch.zeros_like)
    half_zero = scaled_backward("HalfZero", lambda x: (torch.arange(x.numel()).reshape(x.shape) % 2).to(x.dtype))
    reference = lambda x: x * 1.5  # noqa: E731
    assert hint in report_of(zero, torch.randn(2, 3), check="reference", reference=reference)
    assert hint not in report_of(half_zero, torch.randn(2, 3), check="reference", reference=reference)


def test_the_not_linear_in_grad_output_hint_needs_the_jacobian_to_match():
    from reference_ops.buggy import ReLUPositiveGradOnly

    relu = torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]])
    hint = "backward treats grad_output non-linearly"
    assert hint in report_of(ReLUPositiveGradOnly, relu)
    absolute_doubled = scaled_backward("AbsDoubled", lambda x: 2 * torch.ones_like(x))
    assert hint not in report_of(absolute_doubled, relu)  # wrong on the Jacobian already: a factor, not a sign rule


def test_a_constant_factor_that_has_no_name_is_given_as_a_number():
    # 1.5x (a scale applied twice) once got no hint at all: only the named factors (twice, half, ...) were tried.
    import torch

    from pytest_autograd import run_checks

    class TanhScaledTwice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.tanh(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * (1 - torch.tanh(x) ** 2) * 1.5

    for shape in [(3, 4), (200, 300)]:  # the full Jacobian, and probes
        outcome, = run_checks(TanhScaledTwice, torch.randn(*shape), checks=["gradcheck"])
        assert "hint: the analytical gradient is 1.5x the numerical one at every element of `x`: a constant factor " \
               "is off" in outcome.detail, outcome.detail
