"""One full report per root cause; reruns, --lf and repeats never turn a failure into a pass or a skip."""

import pytest

RAISING = """
import pytest, torch

class BackwardRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("my kernel has no backward for this shape")

@pytest.mark.autograd_op(op=BackwardRaises, reference=lambda x: x * 2)
def test_double():
    return (torch.randn(3),)
"""

NO_SAMPLES = """
import pytest, torch

@pytest.mark.autograd_op(op=torch.exp, checks=["gradcheck", "gradgradcheck", "reference"])
def test_exp():
    x = torch.randn(3)
"""

FULL_REPORT_LINE = "  at *test_ops.py:* in backward"


def test_an_op_whose_backward_raises_is_reported_in_full_once(pytester, run_pytest):
    pytester.makepyfile(test_ops=RAISING)
    result = run_pytest()
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] >= 5
    text = result.stdout.str()
    assert text.count("in backward") == 1, text
    assert text.count("  rerun: pytest") == 1, text
    result.stdout.fnmatch_lines([
        "the op's backward raised RuntimeError: my kernel has no backward for this shape",
        "  check gradcheck, device cpu*",
    ])
    pointers = [line for line in result.outlines
                if line.endswith("(same cause as test_ops.py::test_double[gradcheck-cpu]: see its full report)")]
    assert len(pointers) == outcomes["failed"] - 1
    assert all(line.startswith("the op's backward raised RuntimeError") for line in pointers)


def test_every_item_still_fails_when_the_cause_is_shared(pytester, run_pytest):
    pytester.makepyfile(test_ops=RAISING)
    result = run_pytest("-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert "passed" not in outcomes
    assert set(outcomes) <= {"failed", "skipped"}


def test_a_failure_with_its_own_cause_keeps_its_full_report(pytester, run_pytest):
    pytester.makepyfile(
        test_ops="""
        import pytest, torch
        from reference_ops.buggy import LinearGradInputWrong

        @pytest.mark.autograd_op(op=LinearGradInputWrong, checks=["gradcheck", "reference"],
                                 reference=torch.nn.functional.linear)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=2)
    assert "same cause as" not in result.stdout.str()
    assert result.stdout.str().count("  rerun: pytest") == 2


def test_running_only_a_pointing_item_shows_the_full_report(pytester, run_pytest):
    pytester.makepyfile(test_ops=RAISING)
    result = run_pytest("test_ops.py::test_double[reference-cpu]")
    result.assert_outcomes(failed=1)
    assert "same cause as" not in result.stdout.str()
    result.stdout.fnmatch_lines(["the op's backward raised RuntimeError*", "  check reference, device cpu*"])


def test_a_body_without_samples_still_fails_under_reruns(pytester):
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_ops=NO_SAMPLES)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--reruns", "1")
    assert result.parseoutcomes() == {"failed": 3, "rerun": 3}


def test_an_op_that_raises_still_fails_under_reruns(pytester):
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_ops=RAISING)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--reruns", "2",
                                          "--autograd-checks=gradcheck,reference,mutation")
    assert result.parseoutcomes() == {"failed": 3, "rerun": 6}


def test_a_body_without_samples_fails_on_every_repeat(pytester):
    pytest.importorskip("pytest_repeat")
    pytester.makepyfile(test_ops=NO_SAMPLES)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--count", "2")
    result.assert_outcomes(failed=6)


def test_last_failed_reruns_fail_again(pytester):
    pytester.makepyfile(test_ops=NO_SAMPLES)
    first = pytester.runpytest_inprocess()
    first.assert_outcomes(failed=3)
    again = pytester.runpytest_inprocess("--lf")
    again.assert_outcomes(failed=3)
    only_one = pytester.runpytest_inprocess("--lf", "-k", "gradgradcheck")
    only_one.assert_outcomes(failed=1)
    only_one.stdout.fnmatch_lines(["*the test body returned None*"])
    assert "same cause as" not in only_one.stdout.str()


def test_an_xfailed_item_is_never_the_one_others_point_at(pytester, run_pytest):
    pytester.makepyfile(test_ops=RAISING.replace("reference=lambda x: x * 2",
                                                 "reference=lambda x: x * 2, xfail={'gradcheck': 'known'}"))
    result = run_pytest("--autograd-checks=gradcheck,reference,mutation")
    result.assert_outcomes(failed=2, xfailed=1)
    result.stdout.fnmatch_lines(["the op's backward raised RuntimeError*", "  check reference, device cpu*"])
    result.stdout.fnmatch_lines(["*(same cause as test_ops.py::test_double[[]reference-cpu[]]: see its full report)"])
