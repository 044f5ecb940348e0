"""Under -W error, warnings from torch's own machinery inside a check never fail an op; the user's own still do.

These run pytest in a subprocess: torch raises some of its internal
warnings only on the first import of a module (forward-mode AD's
decompositions, inductor), which this test process has long done.
"""

OPS = """
import warnings

import pytest
import torch
from reference_ops.transforms import MulWithJvp, scaled_sin


@pytest.mark.autograd_op(op=MulWithJvp, checks=["forward_ad", "gradcheck"])
def test_mul_with_jvp():
    return [(torch.randn(3), torch.randn(3))]


@pytest.mark.autograd_op(op=scaled_sin, checks=["opcheck"])
def test_scaled_sin():
    return [(torch.randn(3), 2.0)]


def deprecated_double(x):
    warnings.warn("deprecated_double is deprecated, use 2 * x", DeprecationWarning)
    return 2 * x


@pytest.mark.autograd_op(op=deprecated_double, checks=["gradcheck"])
def test_users_own_warning():
    return [(torch.randn(3),)]
"""


def test_torch_internal_warnings_inside_checks_do_not_fail_correct_ops_under_W_error(pytester):
    pytester.makepyfile(test_ops=OPS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "-W", "error", "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines_random([
        "*test_mul_with_jvp[[]forward_ad-cpu[]] PASSED*",
        "*test_scaled_sin[[]opcheck-cpu[]] PASSED*",
        "*the op's forward raised DeprecationWarning: deprecated_double is deprecated, use 2 * x",
    ])
    assert "torch/jit" not in result.stdout.str()


def test_a_note_is_shown_once_at_the_tests_own_line_never_at_a_line_of_the_plugin(pytester, run_pytest):
    pytester.makepyfile(test_kink="""
import pytest, torch
from reference_ops import MyReLU

@pytest.mark.autograd_op(op=MyReLU, reference=torch.relu, checks=["gradcheck"])
def test_relu():
    return [(torch.tensor([-1.0, 0.0, 2.0]),)]
""")
    result = run_pytest("-W", "error")
    result.assert_outcomes(passed=1, warnings=1)
    output = result.stdout.str()
    assert output.count("element(s) at kinks") == 1, output
    result.stdout.fnmatch_lines(["*test_kink.py:4: AutogradNote: sample 0: 1 element(s) at kinks*"])
    assert "pytest_autograd/" not in output
