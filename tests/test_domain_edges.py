"""Ops whose domain ends near their samples are judged inside it: never failed for the step's excursion, never passed
blind.

``sqrt`` of ``torch.rand`` values is the everyday case: some element lies
nearer 0 than the derivative checks' step, the moved outputs are NaN, and a
correct op used to fail ("expected nan (numerical)"); on a small sample the
one NaN element hid every other element's error, so a wrong op passed.
"""

import pytest
import torch

from pytest_autograd import run_checks
from reference_ops.domain_edges import (
    Float32Log,
    Float32LogTenPercentOff,
    Float32Sqrt,
    Float32SqrtTenPercentOff,
    Sqrt,
    SqrtWrongNearZero,
    near_zero_samples,
)

HEADER = """
import pytest
import torch
from reference_ops.domain_edges import *
"""


def marked(op, dtype, checks=None):
    on = f", checks={checks!r}" if checks else ""
    return HEADER + f"""
@pytest.mark.autograd_op(op={op}{on})
def test_op():
    return near_zero_samples(torch.Generator().manual_seed(0), dtype=torch.{dtype})
"""


@pytest.mark.parametrize(("op", "dtype"), [("Sqrt", "float64"), ("Sqrt", "float32"), ("Float32Sqrt", "float32")])
def test_a_correct_op_with_elements_nearer_its_domain_edge_than_the_step_fails_no_default_check(
        pytester, run_pytest, op, dtype):
    pytester.makepyfile(test_ops=marked(op, dtype))
    result = run_pytest("-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "test_ops.py::test_op[[]gradcheck-cpu[]]",
        "*AutogradNote: *element(s)*within * of where the op stops being finite*e.g. x[[]*[]] = 1e-13*",
    ])


def test_the_float64_step_leaving_the_domain_is_noted_with_the_finer_step_used(pytester, run_pytest):
    pytester.makepyfile(test_ops=marked("Sqrt", "float64", ["gradcheck", "gradgradcheck"]))
    result = run_pytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*AutogradNote: sample 1: a step of 1e-06 moving single elements of `x` leaves the op's domain (its "
        "outputs turn inf/NaN*); judged with a step of 3.90625e-09 instead; noted, not failed",
    ])


@pytest.mark.parametrize(("op", "dtype", "message"), [
    ("SqrtTenPercentOff", "float64", "gradient of all outputs w.r.t. `x` does not match the numerical derivative"),
    ("SqrtWrongNearZero", "float64", "gradient of output w.r.t. `x` does not match the numerical derivative"),
    ("Float32SqrtTenPercentOff", "float32",
     "gradient of all outputs w.r.t. `x` does not match the numerical derivative in float32"),
])
def test_a_wrong_backward_near_the_domain_edge_fails_gradcheck(pytester, run_pytest, op, dtype, message):
    pytester.makepyfile(test_ops=marked(op, dtype, ["gradcheck"]))
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message])


def test_one_element_whose_step_leaves_the_domain_hides_no_other_elements_error(pytester, run_pytest):
    # A 30-element sample is judged by the full Jacobian; its NaN column once made every error of `x` pass.
    pytester.makepyfile(test_ops=HEADER + """
@pytest.mark.autograd_op(op=SqrtTenPercentOff, checks=["gradcheck", "gradgradcheck"])
def test_op():
    x = torch.rand(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[3] = 1e-13  # nearer 0 than the finest step tried
    return [(x,)]
""")
    result = run_pytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*gradient of output w.r.t. `x` does not match the numerical derivative*"])


def test_the_element_just_inside_the_domain_is_judged_not_taken_for_a_kink():
    # At x = 1e-7 the one-sided differences differ by curvature, not by a kink: halving the step halves the gap.
    x = torch.rand(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[3] = 1e-7
    (outcome,) = run_checks(SqrtWrongNearZero, x, checks="gradcheck", shrink=0)
    assert outcome.status == "failed"
    assert "d output[3] / d x[3]" in outcome.detail, outcome.detail
    (right,) = run_checks(Sqrt, x, checks="gradcheck", shrink=0)
    assert right.status == "passed", right.detail
    assert "at kinks" not in (right.detail or ""), right.detail


def test_sqrt_of_torch_rand_never_fails_the_float64_derivative_checks():
    # One 262144-element draw in three holds an element nearer 0 than the float64 step.
    noted = []
    for seed in range(4):
        x = torch.rand(512, 512, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        for outcome in run_checks(Sqrt, x, checks=["gradcheck", "gradgradcheck"], seed=seed, shrink=0):
            assert outcome.status == "passed", outcome.detail
            noted.append("leaves the op's domain" in (outcome.detail or ""))
    assert any(noted)


@pytest.mark.parametrize("seed", range(2))
def test_float32_sqrt_of_torch_rand_never_fails_the_float32_derivative_checks(seed):
    x = torch.rand(256, 256, generator=torch.Generator().manual_seed(seed))
    for outcome in run_checks(Float32Sqrt, x, checks=["gradcheck", "gradgradcheck"], seed=seed, shrink=0):
        assert outcome.status != "failed", outcome.detail


def test_a_float32_op_with_elements_no_step_reaches_is_judged_over_the_others():
    (large, _) = near_zero_samples(torch.Generator().manual_seed(0), dtype=torch.float32)
    (right,) = run_checks(Float32Sqrt, *large, checks="gradcheck", shrink=0)
    assert right.status == "passed", right.detail
    assert "3 element(s) of `x` within" in right.detail and "left out of the random directions" in right.detail
    (wrong,) = run_checks(Float32SqrtTenPercentOff, *large, checks="gradcheck", shrink=0)
    assert wrong.status == "failed"


@pytest.mark.parametrize("seed", range(2))
def test_float32_log_of_torch_rand_passes_gradgradcheck_across_the_pole_of_its_backward(seed):
    # log's backward grad / x stays finite across 0: a step over the pole of an element nearer 0 than the step
    # gives differences that mean nothing, with no NaN to say so. Seed 1's draw holds one such element.
    x = torch.rand(512, 512, generator=torch.Generator().manual_seed(seed))
    for outcome in run_checks(Float32Log, x, checks=["gradcheck", "gradgradcheck"], seed=1, shrink=0):
        assert outcome.status != "failed", outcome.detail


def test_a_float32_log_with_a_wrong_backward_still_fails_next_to_the_pole():
    x = torch.rand(512, 512, generator=torch.Generator().manual_seed(1))
    (wrong,) = run_checks(Float32LogTenPercentOff, x, checks="gradcheck", seed=1, shrink=0)
    assert wrong.status == "failed"
    assert "does not match the numerical derivative in float32" in wrong.detail, wrong.detail


def test_a_float32_computing_op_that_passes_float64_probes_only_within_a_wide_tolerance_is_judged_in_float32(
        pytester, run_pytest):
    # The element next to log's pole makes the float64 probes' measured noise, hence their tolerance, wide enough
    # for a gradient 10% off everywhere: that pass is blurred, and the op, computing in float32, is judged there.
    pytester.makepyfile(test_ops=HEADER + """
@pytest.mark.autograd_op(op=Float32LogTenPercentOff, checks=["gradcheck"])
def test_op():
    return [(torch.rand(512, 512, generator=torch.Generator().manual_seed(1)),)]
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gradient of all outputs w.r.t. `x` does not match the numerical derivative in "
                                 "float32*"])
