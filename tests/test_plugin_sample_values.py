"""Samples and options no check could judge are refused with a message naming them, never a silent pass."""

import pytest

from test_plugin_usage_errors import assert_no_traceback

SCALE_TOO_LARGE = """
import pytest
import torch


class ScaleTooLarge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x  # 1.5x the true derivative 2x
"""


def test_a_sample_holding_nan_is_refused_naming_the_argument_and_the_element(pytester, run_pytest):
    pytester.makepyfile(SCALE_TOO_LARGE + """
@pytest.mark.autograd_op(op=ScaleTooLarge)
def test_square():
    x = torch.randn(2, 3)
    x[1, 2] = float("nan")
    return [(x,)]
""")
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck,undefined_grad")
    result.assert_outcomes(failed=3)  # the first item shows the report, the others point at it
    result.stdout.fnmatch_lines([
        "*test_square[[]gradcheck-cpu[]]: sample 0 argument `x` holds nan at [[]1, 2[]] (1 non-finite element(s) of 6).*",
        "*(same cause as *test_square[[]gradcheck-cpu[]]: see its full report)"])
    assert_no_traceback(result)


def test_a_sample_holding_inf_is_refused_by_the_fixture_too(pytester, run_pytest):
    pytester.makepyfile(SCALE_TOO_LARGE + """
def test_square(autograd_check):
    x = torch.tensor([1.0, float("-inf")])
    autograd_check(ScaleTooLarge, x, checks=["gradcheck"])
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*autograd_check: sample 0 argument `x` holds -inf at [[]1[]]*"])
    assert_no_traceback(result)


def test_a_non_finite_constant_such_as_a_mask_is_accepted(pytester, run_pytest):
    pytester.makepyfile("""
import pytest
import torch

def masked_softmax(x, mask):
    return torch.softmax(x + mask, dim=-1)

@pytest.mark.autograd_op(op=masked_softmax, constants=("mask",))
def test_masked_softmax():
    mask = torch.zeros(3, 3).masked_fill(torch.ones(3, 3).triu(1).bool(), float("-inf"))
    return [(torch.randn(3, 3), mask)]
""")
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("option", ["atol=float('nan')", "rtol=float('inf')"])
def test_non_finite_tolerances_are_refused_on_the_marker(pytester, run_pytest, option):
    pytester.makepyfile(SCALE_TOO_LARGE + f"""
@pytest.mark.autograd_op(op=ScaleTooLarge, {option})
def test_square():
    return [(torch.randn(3),)]
""")
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_square: ?tol=* would make every comparison pass*"])
    assert_no_traceback(result)


def test_non_finite_tolerances_are_refused_by_the_fixture(pytester, run_pytest):
    pytester.makepyfile(SCALE_TOO_LARGE + """
def test_square(autograd_check):
    autograd_check(ScaleTooLarge, torch.randn(3), checks=["gradcheck"], atol=float("nan"))
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*autograd_check: atol=nan would make every comparison pass*"])
    assert_no_traceback(result)


@pytest.mark.parametrize("build, words", [
    ("torch.randn(3, 3).to_sparse()", "is a sparse_coo tensor; the checks perturb and compare dense*"),
    ("torch.randn(3, 3).to_sparse_csr()", "is a sparse_csr tensor*"),
    ("torch.empty(3, 3, device='meta')", "is on the meta device, which holds no values*"),
])
def test_sparse_and_meta_samples_are_a_usage_error_without_a_traceback(pytester, run_pytest, build, words):
    pytester.makepyfile(f"""
import pytest
import torch

@pytest.mark.autograd_op(op=torch.sin)
def test_sin():
    return [({build},)]
""")
    result = run_pytest()
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] >= 1 and "passed" not in outcomes
    result.stdout.fnmatch_lines([f"*test_sin[[]*-cpu[]]: sample 0 argument `self` {words}"])
    assert_no_traceback(result)


@pytest.mark.parametrize("devices", ['torch.device("cpu")', '[torch.device("cpu")]'])
def test_devices_on_the_marker_may_be_torch_devices(pytester, run_pytest, devices):
    pytester.makepyfile(f"""
import pytest
import torch

@pytest.mark.autograd_op(op=torch.sin, devices={devices})
def test_sin():
    return [(torch.randn(3),)]
""")
    result = run_pytest("--autograd-checks=gradcheck", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_sin[[]gradcheck-cpu[]] PASSED*"])


def test_devices_given_to_the_fixture_may_be_torch_devices(pytester, run_pytest):
    pytester.makepyfile("""
import torch

def test_sin(autograd_check):
    outcomes = autograd_check(torch.sin, torch.randn(3), checks=["gradcheck"], devices=torch.device("cpu"))
    assert [(o.check, o.device, o.status) for o in outcomes] == [("gradcheck", "cpu", "passed")]
""")
    run_pytest().assert_outcomes(passed=1)


def test_an_op_returning_a_sparse_tensor_is_checked_on_its_dense_values(pytester, run_pytest):
    pytester.makepyfile("""
import pytest
import torch


class SparseDoubleWrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x * 2).to_sparse()

    @staticmethod
    def backward(ctx, grad):
        return grad.to_dense() * 3


@pytest.mark.autograd_op(op=lambda x: (x * 2).to_sparse())
def test_sparse_double():
    return [(torch.randn(3, 3),)]


@pytest.mark.autograd_op(op=SparseDoubleWrongGrad)
def test_sparse_double_wrong_grad():
    return [(torch.randn(3, 3),)]
""")
    result = run_pytest("--autograd-checks=gradcheck", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines_random([
        "*test_sparse_double[[]gradcheck-cpu[]] PASSED*",
        "gradient of output w.r.t. `x` does not match the numerical derivative",
    ])
    assert_no_traceback(result)


@pytest.mark.parametrize("devices", ['torch.device("cpu")', '[torch.device("cpu")]'])
def test_parity_reads_torch_devices_on_the_marker_too(pytester, run_pytest, devices):
    pytester.makepyfile(f"""
import pytest
import torch

@pytest.mark.autograd_op(op=torch.sin, devices={devices})
def test_sin():
    return [(torch.randn(3),)]
""")
    result = run_pytest("--autograd-checks=parity", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*parity compares a non-CPU device against CPU*"])
    assert_no_traceback(result)
