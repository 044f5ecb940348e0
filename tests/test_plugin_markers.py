"""Markers never break a suite; a marker that would leave an op unchecked fails the test that carries it."""

import pytest

PROJECT_MARKERS = """
import pytest

@pytest.mark.autograd
def test_autograd_marked():
    pass

@pytest.mark.autograd_slow
def test_slow():
    pass

@pytest.mark.autograd_function
def test_function():
    pass

@pytest.mark.autograd_ops
def test_near_miss_registered_by_the_project():
    pass
"""

TYPO = """
import pytest, torch

@pytest.mark.autograd_ops(op=torch.exp)
def test_typo():
    return (torch.randn(3),)

def test_plain():
    pass
"""


def test_markers_the_project_registers_in_its_ini_never_stop_the_session(pytester, run_pytest):
    pytester.makeini("[pytest]\nmarkers =\n    autograd\n    autograd_slow: slow ones\n"
                     "    autograd_function\n    autograd_ops(x): near miss, but the project's own\n")
    pytester.makepyfile(test_project=PROJECT_MARKERS)
    result = run_pytest("--strict-markers")
    result.assert_outcomes(passed=4)


def test_markers_a_conftest_registers_with_addinivalue_line_are_never_an_error(pytester, run_pytest):
    pytester.makeconftest(
        """
        def pytest_configure(config):
            for name in ("autograd", "autograd_slow", "autograd_function", "autograd_ops"):
                config.addinivalue_line("markers", f"{name}: the project's own marker")
        """
    )
    pytester.makepyfile(test_project=PROJECT_MARKERS)
    run_pytest("--strict-markers").assert_outcomes(passed=4)


def test_unregistered_markers_that_are_no_typo_of_autograd_op_only_warn(pytester, run_pytest):
    pytester.makepyfile(test_project=PROJECT_MARKERS.replace("@pytest.mark.autograd_ops\n", ""))
    result = run_pytest()
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK


def test_a_near_miss_of_autograd_op_fails_only_the_test_that_carries_it(pytester, run_pytest):
    pytester.makepyfile(test_ops=TYPO)
    result = run_pytest("-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_ops.py::test_typo: @pytest.mark.autograd_ops is not a registered marker and "
                                 "looks like a typo of @pytest.mark.autograd_op: as written, the op is never checked.*"])


@pytest.mark.parametrize("deselect", [["-k", "plain"], ["-m", "not autograd_ops"]])
def test_a_deselected_test_with_a_near_miss_marker_is_not_reported(pytester, run_pytest, deselect):
    pytester.makepyfile(test_ops=TYPO)
    result = run_pytest("-W", "ignore::pytest.PytestUnknownMarkWarning", *deselect)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    assert "typo" not in result.stdout.str()


def test_an_autograd_prefixed_marker_given_op_is_reported_as_a_typo(pytester, run_pytest):
    pytester.makepyfile(TYPO.replace("autograd_ops(", "autograd("))
    result = run_pytest("-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.autograd is not a registered marker and looks like a typo*"])


UNITTEST = """
import unittest
import pytest, torch
from reference_ops.buggy import LinearGradInputWrong

class TestLinear(unittest.TestCase):
    @pytest.mark.autograd_op(op=LinearGradInputWrong, checks=["gradcheck"])
    def test_linear(self):
        return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]

    def test_plain(self):
        self.assertEqual(1 + 1, 2)
"""


def test_autograd_op_on_a_unittest_method_is_refused_with_how_to_write_the_test(pytester, run_pytest):
    pytester.makepyfile(test_unit=UNITTEST)
    result = run_pytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_unit.py::TestLinear::test_linear: @pytest.mark.autograd_op does not work on a "
                                 "unittest.TestCase method*Move the test to a plain function or a plain class*"])


TWO_MARKERS = """
import pytest, torch
from reference_ops import MyReLU
from reference_ops.buggy import ReLUPositiveGradOnly

@pytest.mark.autograd_op(op=MyReLU, checks=["gradcheck"])
@pytest.mark.autograd_op(op=ReLUPositiveGradOnly, checks=["gradcheck"])
def test_relu():
    return (torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]]),)
"""


def test_two_autograd_op_markers_check_both_ops_in_items_named_after_them(pytester, run_pytest):
    pytester.makepyfile(test_ops=TWO_MARKERS)
    result = run_pytest("-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_relu[[]ReLUPositiveGradOnly-gradcheck-cpu[]] FAILED*",
                                 "*test_relu[[]MyReLU-gradcheck-cpu[]] PASSED*"])


def test_two_markers_with_the_same_op_get_numbered_items(pytester, run_pytest):
    pytester.makepyfile(test_ops=TWO_MARKERS.replace("op=ReLUPositiveGradOnly", "op=MyReLU, atol=1e-3"))
    result = run_pytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_relu[[]op0-MyReLU-gradcheck-cpu[]] PASSED*",
                                 "*test_relu[[]op1-MyReLU-gradcheck-cpu[]] PASSED*"])


# Every way pytest lets a marker reach a test: it either makes items per check or fails naming the way that does.
WRONG_RELU = """
import pytest, torch
from reference_ops.buggy import ReLUPositiveGradOnly

def samples():
    return [(torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]]),)]

MARK = pytest.mark.autograd_op(op=ReLUPositiveGradOnly, reference=torch.relu, checks=["gradcheck"])
"""


def test_a_marker_on_a_class_checks_each_of_its_tests(pytester, run_pytest):
    pytester.makepyfile(WRONG_RELU + """
@MARK
class TestReLU:
    def test_relu(self):
        return samples()
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED *TestReLU::test_relu[[]gradcheck-cpu[]]*"])


def test_a_module_pytestmark_checks_each_test_of_the_module(pytester, run_pytest):
    pytester.makepyfile(WRONG_RELU + """
pytestmark = MARK

def test_relu():
    return samples()
""")
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED *test_relu[[]gradcheck-cpu[]]*"])


def test_a_marker_given_through_pytest_param_fails_naming_the_supported_form(pytester, run_pytest):
    pytester.makepyfile(WRONG_RELU + """
@pytest.mark.parametrize("n", [pytest.param(1, marks=MARK)])
def test_relu(n):
    return samples()
""")
    result = run_pytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_relu[[]1[]]: @pytest.mark.autograd_op reached this test after its items were "
                                 "made (through pytest.param(..., marks=...) or item.add_marker), so no check would "
                                 "run*stack one @pytest.mark.autograd_op(op=...) per op*"])


def test_a_marker_added_by_a_hook_after_collection_fails_the_test(pytester, run_pytest):
    pytester.makeconftest(WRONG_RELU + """
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(MARK)
""")
    pytester.makepyfile("from conftest import samples\n\ndef test_relu():\n    return samples()\n")
    result = run_pytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*reached this test after its items were made*"])


def test_a_marker_on_a_fixture_never_passes_silently(pytester, run_pytest):
    pytester.makepyfile(WRONG_RELU + """
@pytest.fixture
@MARK
def relu_samples():
    return samples()

def test_relu(relu_samples):
    pass
""")
    result = run_pytest()
    outcomes = result.parseoutcomes()
    assert "passed" not in outcomes, result.stdout.str()
    if pytest.version_tuple < (9,):  # pytest 9 refuses marks on fixtures itself, at collection
        result.stdout.fnmatch_lines(["*test_relu: @pytest.mark.autograd_op is on the fixture 'relu_samples', where "
                                     "pytest ignores marks*Put the marker on the test function*"])


def test_a_hypothesis_given_test_fails_naming_what_to_write_instead(pytester, run_pytest):
    pytest.importorskip("hypothesis")
    pytester.makepyfile(WRONG_RELU + """
from hypothesis import given, strategies as st

@given(st.integers(1, 4))
@MARK
def test_relu(n):
    return [(torch.randn(n, 3),)]
""")
    result = run_pytest("-p", "hypothesispytest")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_relu[[]gradcheck-cpu[]]: @pytest.mark.autograd_op cannot use a hypothesis "
                                 "@given test*call pytest_autograd.run_checks(op, *args) inside the test*"])
