"""The plugin's ini options read from every config file form, pytest 9's native [tool.pytest] table included."""

import pytest

NATIVE_TOML = pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest 9 introduced the [tool.pytest] table")


def header(result):
    return next(line for line in result.outlines if line.startswith("autograd:"))


@NATIVE_TOML
def test_the_native_toml_table_accepts_lists_and_an_int_seed(pytester, run_pytest):
    pytester.makepyprojecttoml(
        """
        [tool.pytest]
        autograd_devices = ["cpu", "cuda"]
        autograd_checks = ["gradcheck", "parity"]
        autograd_seed = 7
        """
    )
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest()
    result.assert_outcomes(passed=1)
    assert header(result) == "autograd: devices=cpu,cuda checks=gradcheck,parity seed=7"


@NATIVE_TOML
def test_the_native_toml_table_accepts_a_random_seed(pytester, run_pytest):
    pytester.makepyprojecttoml('[tool.pytest]\nautograd_seed = "random"\n')
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest()
    assert header(result).startswith("autograd: devices=cpu checks=all seed=")


def test_ini_options_strings_keep_working(pytester, run_pytest):
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        autograd_devices = "cpu,cuda"
        autograd_checks = "gradcheck, parity"
        autograd_seed = "7"
        """
    )
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest()
    assert header(result) == "autograd: devices=cpu,cuda checks=gradcheck,parity seed=7"


def test_an_ini_file_with_space_separated_devices_works(pytester, run_pytest):
    pytester.makeini("[pytest]\nautograd_devices = cpu cuda\nautograd_seed = random\n")
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest()
    assert header(result).startswith("autograd: devices=cpu,cuda checks=all seed=")


@NATIVE_TOML
def test_an_unknown_check_in_the_native_table_is_still_a_usage_error(pytester, run_pytest):
    pytester.makepyprojecttoml('[tool.pytest]\nautograd_checks = ["gradchek"]\n')
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown check(s) 'gradchek' (did you mean gradcheck?)*"])
