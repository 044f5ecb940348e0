"""forward_ad: a Function's jvp against numerical derivatives and against its own backward."""

import pytest
import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.transforms import MulWithJvp

OPS = """
import pytest
import torch
from reference_ops import ElementwiseMul
from reference_ops.transforms import MulJvpReusesTangent, MulWithJvp


class MulBackwardWrong(MulWithJvp):
    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        return grad_output * b, grad_output * b  # should be grad_output * a


def samples():
    return [(torch.randn(3, 4), torch.randn(3, 4))]


@pytest.mark.autograd_op(op={op})
def test_op():
    return samples()
"""


@pytest.fixture(scope="module", autouse=True)
def torch_machinery_imported():
    """Run the check once before any in-process pytester run: pytester drops modules first
    imported during a run, and parts of torch refuse to be imported twice."""
    run_checks(MulWithJvp, torch.randn(3), torch.randn(3), checks="forward_ad")


def run(pytester, op):
    pytester.makepyfile(test_ops=OPS.format(op=op))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=forward_ad", "-rs")


def test_a_jvp_that_reuses_one_tangent_fails_naming_the_argument(pytester):
    result = run(pytester, "MulJvpReusesTangent")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*jvp: tangent of output along a direction in `a` does not match the numerical directional derivative",
        "*check forward_ad, device cpu, dtype float64, sample 0",
        "*output: output, argument: a",
        "*worst element: tangent of output*: expected *, got *",
        "*hint: jvp must return J(x) @ tangents*",
    ])


def test_a_correct_jvp_passes(pytester):
    run(pytester, "MulWithJvp").assert_outcomes(passed=1)


def test_a_backward_that_disagrees_with_a_correct_jvp_fails(pytester):
    result = run(pytester, "MulBackwardWrong")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*forward and backward mode disagree along a direction in `b`: <v, J u> from jvp differs "
         "from <J^T v, u> from backward"),
        "*jvp gives *, backward gives * (abs error * > tolerance *)",
        "*hint: jvp matches the numerical derivative, so backward is the wrong one*",
    ])


def test_a_function_without_jvp_is_skipped_with_the_reason(pytester):
    result = run(pytester, "ElementwiseMul")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*op defines no jvp*"])


def jvp_scaled(name, scale):
    """MulWithJvp whose jvp multiplies the tangent by ``scale`` (a tensor of factors)."""

    def jvp(ctx, a_t, b_t):
        a, b = ctx.saved_tensors
        return (a_t * b + a * b_t) * scale

    return type(name, (MulWithJvp,), {"jvp": staticmethod(jvp)})


def test_the_factor_hint_needs_the_factor_at_every_element_of_the_tangent():
    a, b = torch.randn(8, 6), torch.randn(8, 6)
    [doubled] = run_checks(jvp_scaled("Doubled", 2.0), a, b, checks="forward_ad", shrink=0)
    assert "hint: the tangent is twice the numerical one at every element: a constant factor is off" in doubled.detail
    # Twice in one column whose values are 100 times the others': a tolerance relative to the largest element
    # let that column decide for the rest.
    a[:, 2], b[:, 2] = a[:, 2] * 100, b[:, 2] * 100
    column = torch.ones(8, 6, dtype=torch.float64)
    column[:, 2] = 2.0
    [one_column] = run_checks(jvp_scaled("ColumnDoubled", column), a, b, checks="forward_ad", shrink=0)
    assert one_column.status == "failed" and "constant factor" not in one_column.detail, one_column.detail
