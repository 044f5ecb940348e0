"""xfail= on the marker: expected failures of single checks, the other checks of the test unaffected."""

import pytest

CUBE = """
import pytest
import torch
from reference_ops.buggy import CubeNotDifferentiableBackward

@pytest.mark.autograd_op(op=CubeNotDifferentiableBackward, checks=["gradcheck", "gradgradcheck"]{extra})
def test_cube():
    return (torch.randn(4, dtype=torch.float64),)
"""


def cube_test(pytester, extra):
    pytester.makepyfile(test_ops=CUBE.format(extra=extra))


def test_without_xfail_the_known_failure_fails_the_run(pytester, run_pytest):
    cube_test(pytester, "")
    run_pytest().assert_outcomes(passed=1, failed=1)


def test_xfail_marks_only_the_named_check_as_expected_to_fail(pytester, run_pytest):
    cube_test(pytester, ', xfail={"gradgradcheck": "double backward lands next release"}')
    result = run_pytest("-rxX", "-v")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*test_cube[[]gradcheck-cpu[]] PASSED*",
                                 "*test_cube[[]gradgradcheck-cpu[]] XFAIL*",
                                 "XFAIL*test_cube[[]gradgradcheck-cpu[]] - double backward lands next release*"])


def test_under_xfail_strict_the_other_checks_still_pass(pytester, run_pytest):
    pytester.makeini("[pytest]\nxfail_strict = true\n")
    cube_test(pytester, ', xfail={"gradgradcheck": "known"}')
    result = run_pytest()
    result.assert_outcomes(passed=1, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_under_xfail_strict_an_xfailed_check_that_passes_fails_the_run(pytester, run_pytest):
    pytester.makeini("[pytest]\nxfail_strict = true\n")
    cube_test(pytester, ', xfail={"gradcheck": "thought to be wrong"}')
    result = run_pytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["FAILED *test_cube[[]gradcheck-cpu[]]*"])
    result.stdout.fnmatch_lines(["*[[]XPASS(strict)[]] thought to be wrong*"])


def test_xfail_accepts_a_check_name_with_a_generic_reason(pytester, run_pytest):
    cube_test(pytester, ', xfail="gradgradcheck"')
    result = run_pytest("-rx")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL*expected to fail (xfail= on the autograd_op marker)*"])


def test_a_misspelled_check_in_xfail_gets_a_suggestion(pytester, run_pytest):
    cube_test(pytester, ', xfail={"gradgradchek": "known"}')
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_cube: xfail= names unknown check(s) 'gradgradchek' "
                                 "(did you mean gradgradcheck?); known checks are: *"])


def test_an_xfail_reason_that_is_not_text_is_refused(pytester, run_pytest):
    cube_test(pytester, ', xfail={"gradgradcheck": True}')
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*xfail= reason for 'gradgradcheck' must be a string*"])
