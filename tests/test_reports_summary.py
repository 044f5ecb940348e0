"""The end-of-session table says which test failed which check, not only how many."""

TESTS = """
import pytest, torch
from reference_ops import LinearFunction
from reference_ops.buggy import LinearWeightGradTransposed, ReLUPositiveGradOnly

@pytest.mark.autograd_op(op=LinearFunction, checks=["gradcheck", "gradgradcheck"])
def test_good_linear():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]

@pytest.mark.autograd_op(op=LinearWeightGradTransposed, checks=["gradcheck", "gradgradcheck"])
def test_bad_linear():
    return [(torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))]

@pytest.mark.parametrize("size", [3, 4])
@pytest.mark.autograd_op(op=ReLUPositiveGradOnly, checks=["gradcheck"])
def test_bad_relu(size):
    return [(torch.randn(size, 3),)]
"""


def test_the_summary_lists_each_failing_test_with_its_failed_items(pytester, run_pytest):
    pytester.makepyfile(test_ops=TESTS)
    result = run_pytest()
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines([
        "failed items, by test:",
        "  test_ops.py::test_bad_linear * gradcheck-cpu",
        "  test_ops.py::test_bad_relu[[]3[]] * gradcheck-cpu",
        "  test_ops.py::test_bad_relu[[]4[]] * gradcheck-cpu",
    ])
    result.stdout.no_fnmatch_line("*test_good_linear  *")


def test_a_green_run_lists_no_failing_tests(pytester, run_pytest):
    pytester.makepyfile(test_ops=TESTS.split("@pytest.mark.autograd_op(op=LinearWeightGradTransposed")[0])
    run_pytest().assert_outcomes(passed=2)
