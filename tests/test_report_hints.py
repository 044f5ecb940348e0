"""Every wrong argument is named, and each hint fires only when the evidence shows its pattern.

For each hint: an op whose failure has the pattern (the hint is there) and
one whose failure does not (the hint is not), so a hint cannot fire on a
coincidence of the worst element. A hint claims its pattern only over the
elements it was measured on: every element (the full Jacobian), those
compared, or the directions probed, and a pattern confined to a column or a
row says so.
"""

from fnmatch import fnmatchcase as fnmatch

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
# Where a pattern was measured: every element one by one (the full Jacobian), or the located element and random
# directions over the argument (probes), which a hint must say rather than "every element".
OVER = {SMALL: "at every element of `x`", LARGE: "at grad x[[]*] and along * random directions over all 1536 elements "
                                                 "of `x`"}


def hint_of(detail):
    return next((line for line in detail.splitlines() if line.startswith("  hint: ")), "")


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
    assert fnmatch(hint_of(report_of(NEGATED, x)), f"  hint: the analytical gradient has the wrong sign {OVER[shape]}")
    assert "wrong sign" not in report_of(NEGATED_AT_ONE, x)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_the_factor_hint_needs_one_factor_at_every_element(shape):
    x = torch.randn(*shape)
    assert fnmatch(hint_of(report_of(DOUBLED, x)), f"  hint: the analytical gradient is twice the numerical one "
                                                   f"{OVER[shape]}: a constant factor is off")
    assert "constant factor" not in report_of(DOUBLED_OR_TRIPLED, x)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["full-jacobian", "probing"])
def test_the_single_element_hint_needs_every_other_element_right(shape):
    x = torch.randn(*shape)
    rest = {SMALL: "; every other element of `x`'s gradient matches",
            LARGE: ": it fails alone, and a random direction over the other 1535 elements of `x` matches"}[shape]
    assert f"hint: only grad x[0, 3] is wrong{rest}" in report_of(ONE_WRONG, x)
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

    over = {(3, 4): "at every element of `x`",
            (200, 300): "at grad x[[]*] and along * random directions over all 60000 elements of `x`"}
    for shape in over:  # the full Jacobian, and probes
        outcome, = run_checks(TanhScaledTwice, torch.randn(*shape), checks=["gradcheck"])
        assert fnmatch(hint_of(outcome.detail), f"  hint: the analytical gradient is 1.5x the numerical one "
                                                f"{over[shape]}: a constant factor is off"), outcome.detail


def linear_args(shape):
    """input, weight and bias of a linear layer: the full Jacobian at (3, 4), probes at (64, 128)."""
    batch, features = shape
    return torch.randn(batch, features), torch.randn(5, features), torch.randn(5)


@pytest.mark.parametrize("shape", [(3, 4), (64, 128)], ids=["full-jacobian", "probing"])
def test_a_gradient_wrong_in_one_column_is_named_by_its_column_not_as_every_element(shape):
    from reference_ops.buggy import LinearWeightGradLastColumnTwice

    hint = hint_of(report_of(LinearWeightGradLastColumnTwice, *linear_args(shape)))
    last = shape[1] - 1
    assert hint.startswith(f"  hint: the analytical gradient is wrong only in column {last} of `weight`: twice the "
                           "numerical one there"), hint
    assert "every element" not in hint and "constant factor" not in hint, hint
    if shape == (3, 4):
        assert "right at every other element: an index, stride or bound that treats this slice apart" in hint, hint
    else:  # probes compared directions over the column and over the rest, not each element
        assert fnmatch(hint, "*(at grad weight[[]*, 127] and along * random direction* over its 5 elements), right "
                             "along a random direction over the other 635 elements: *"), hint


@pytest.mark.parametrize("shape", [(3, 4), (64, 128)], ids=["full-jacobian", "probing"])
def test_a_gradient_wrong_in_one_row_is_named_by_its_row(shape):
    from reference_ops.buggy import LinearGradInputFirstRowTwice

    hint = hint_of(report_of(LinearGradInputFirstRowTwice, *linear_args(shape)))
    assert hint.startswith("  hint: the analytical gradient is wrong only in row 0 of `input`: twice the numerical "
                           "one there"), hint


def test_a_column_whose_gradients_dominate_is_not_read_as_a_factor_at_every_element():
    # One probe over the whole argument let the column's gradients, 100 times the others', decide: "twice the
    # numerical one at every element of `x`", while every other column was right.
    column_doubled = scaled_backward("ColumnDoubled",
                                     lambda x: torch.ones_like(x).index_fill(1, torch.tensor([2]), 2.0))
    x = torch.randn(64, 64) * 0.1
    x[:, 2] = torch.randn(64) * 10
    hint = hint_of(report_of(column_doubled, x))
    assert hint.startswith("  hint: the analytical gradient is wrong only in column 2 of `x`: twice the numerical one "
                           "there"), hint
    assert "constant factor" not in hint


def test_the_slice_hint_needs_a_factor_or_every_element_of_the_slice_wrong():
    # Elements 0 and 3 of a (3, 4) input share row 0 by chance: no slice handled apart.
    for shape in (SMALL, LARGE):
        assert "wrong only in" not in report_of(TWO_WRONG, torch.randn(*shape))
    offset_column = scaled_backward("OffsetColumn", lambda x: 1 + (torch.arange(x.shape[1]) == 1).to(x.dtype) / x)
    assert hint_of(report_of(offset_column, torch.rand(3, 4) + 0.5)).startswith(
        "  hint: the analytical gradient is wrong only in column 1 of `x`: all 3 of its elements wrong, right at every "
        "other element")


def test_a_factor_hint_says_how_many_elements_were_compared_when_kinks_were_left_out():
    class ReLUDoubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.clamp(min=0)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * grad * (x > 0)

    x = torch.tensor([[-1.5, 0.5, 2.0, 1.0], [0.0, -0.25, 3.0, 0.0]])
    hint = hint_of(report_of(ReLUDoubled, x))
    assert hint == ("  hint: the analytical gradient is twice the numerical one at the 6 elements of `x` compared (2 "
                    "more at a kink, a jump or the domain's edge are judged apart): a constant factor is off"), hint
