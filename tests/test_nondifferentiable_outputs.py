"""Outputs an autograd.Function declares non-differentiable (ctx.mark_non_differentiable) are not judged for a
gradient; the differentiable ones still are, and an output a plain function detached is still the op's bug."""

import torch

from pytest_autograd import Sample, run_checks

OPS = """
import pytest
from reference_ops.statistics_outputs import *


@pytest.mark.autograd_op(op={op}, reference=rms_norm_with_rstd_reference)
def test_rms_norm():
    return rms_norm_with_rstd_samples()
"""


def test_a_function_returning_a_statistic_marked_non_differentiable_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS.format(op="RMSNormWithRstd"))
    result = run_pytest("-rP")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 15
    result.stdout.fnmatch_lines(["*output 1 is declared non-differentiable (ctx.mark_non_differentiable): its "
                                 "gradient is not judged*"])


def test_a_wrong_weight_gradient_beside_a_non_differentiable_statistic_still_fails(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS.format(op="RMSNormWithRstdWeightGradWrong"))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of * w.r.t. `w` does not match the numerical derivative"])


def test_an_output_a_plain_function_detached_is_still_reported():
    def op(x):
        y = torch.tanh(x)
        return y, y.detach() * 2  # the second output lost its graph: a bug, not a declaration

    outcome, = run_checks(op, samples=Sample(torch.randn(3, 4)), checks=["gradcheck"])
    assert outcome.status == "failed"
    assert outcome.detail.startswith("gradient of output 1 w.r.t. `x` does not match the numerical derivative")
