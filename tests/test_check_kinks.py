"""Kinks and ties: correct ops at their kinks pass every default check with a note; wrong ones still fail."""

OPS = """
import pytest
import torch
from reference_ops.kinks import (
    AbsFunction, ClampFunction, MaxWithTies, RowNorm,
    abs_samples, clamp_samples, max_with_ties_samples, row_norm_samples,
)
from reference_ops.buggy_kinks import ClampGradientLeaksBelow, MaxTiesFullGradient

def amax(x, dim):
    return x.amax(dim)

def row_norm(x):
    return x.norm(dim=-1)

@pytest.mark.autograd_op(op={op}, reference={reference})
def test_op():
    return {samples}
"""


def run_all(pytester, run_pytest, op, reference, samples, *args):
    pytester.makepyfile(test_ops=OPS.format(op=op, reference=reference, samples=samples))
    return run_pytest(*args)


def test_a_correct_clamp_on_integer_valued_samples_passes_every_default_check_with_a_kink_note(pytester, run_pytest):
    result = run_all(pytester, run_pytest, "ClampFunction", "torch.clamp", "clamp_samples()")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "test_ops.py::test_op[[]gradcheck-cpu[]]",
        "  *test_ops.py:*: AutogradNote: sample 0: * element(s) at kinks (left and right derivatives "
        "differ; the analytical value lies between them), e.g. d output[[]*[]] / d x[[]*[]]: left *, right *, "
        "analytical *; noted, not failed",
        "test_ops.py::test_op[[]gradgradcheck-cpu[]]",
        "  *test_ops.py:*: AutogradNote: sample 0: * element(s) at kinks*",
    ])


def test_a_correct_max_with_ties_passes_every_default_check(pytester, run_pytest):
    result = run_all(pytester, run_pytest, "MaxWithTies", "amax", "max_with_ties_samples()")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["test_ops.py::test_op[[]gradcheck-cpu[]]",
                                 "  *test_ops.py:*: AutogradNote: sample 0: * element(s) at kinks*"])


def test_abs_at_zero_and_a_norm_of_a_zero_row_pass_every_default_check(pytester, run_pytest):
    for op, reference, samples in (("AbsFunction", "torch.abs", "abs_samples()"),
                                   ("RowNorm", "row_norm", "row_norm_samples()")):
        result = run_all(pytester, run_pytest, op, reference, samples)
        assert result.ret == 0, result.stdout.str()
        result.stdout.fnmatch_lines(["test_ops.py::test_op[[]gradgradcheck-cpu[]]",
                                     "  *test_ops.py:*: AutogradNote: sample 0: * element(s) where the differentiated "
                                     "function jumps (one-sided differences grow like 1/eps)*; noted, not failed"])


def test_a_clamp_whose_gradient_leaks_below_the_bound_fails_gradcheck_away_from_the_kinks(pytester, run_pytest):
    result = run_all(pytester, run_pytest, "ClampGradientLeaksBelow", "torch.clamp", "clamp_samples()",
                     "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: output, argument: x",
        "  worst element: d output[[]*[]] / d x[[]*[]]: expected 0 (numerical), got 1 (analytical)",
        # The integer-valued sample ties the leaking elements; the failure stands at a tie-free point too.
        "  abs error 1 > tolerance 1e-05 (full Jacobian; at a tie-free point: the sample's tied values in `x` moved "
        "apart by less than half the gap to any other value, so no selection flips and the failure is not the tie's)",
    ], consecutive=True)


def test_max_giving_every_tie_the_full_gradient_fails_along_the_tied_direction(pytester, run_pytest):
    result = run_all(pytester, run_pytest, "MaxTiesFullGradient", "amax", "max_with_ties_samples()",
                     "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: output, argument: x",
        "  worst element: d output[[]*[]] along all * kink elements moved together: expected 1 (numerical), "
        "got * (analytical)",
        "  abs error * > tolerance * (every kink element moved together, a direction where the left and right "
        "derivatives agree: the gradients of tied elements must add up to it)",
        "  hint: the gradients of tied elements add up to more (or less) than the derivative along them: a tie "
        "rule that gives every tied element the full gradient*",
    ], consecutive=True)


def test_a_wrong_derivative_next_to_a_kink_is_not_excused_as_one(pytester, run_pytest):
    # The leaking clamp at a sample away from its bounds: no kink anywhere, plain failure.
    result = run_all(pytester, run_pytest, "ClampGradientLeaksBelow", "torch.clamp",
                     "[(torch.tensor([[-2.5, 0.5], [1.5, -1.7]]), -1.0, 2.0)]", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    assert "kinks" not in result.stdout.str()
