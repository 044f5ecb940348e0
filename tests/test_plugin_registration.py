"""The plugin is found through its entry point, can be disabled, and costs no torch import."""

import subprocess
import sys

import pytest


def test_plugin_is_registered_through_its_entry_point(pytester, run_pytest):
    config = pytester.parseconfig()
    assert config.pluginmanager.hasplugin("autograd")
    plugin = config.pluginmanager.get_plugin("autograd")
    assert plugin.__name__ == "pytest_autograd.plugin"


def test_trace_config_lists_the_autograd_plugin(pytester, run_pytest):
    result = run_pytest("--trace-config", "--collect-only")
    result.stdout.fnmatch_lines(["*autograd*pytest_autograd*plugin*"])


def test_header_shows_devices_checks_and_seed(pytester, run_pytest):
    pytester.makepyfile("def test_nothing(): pass")
    result = run_pytest("--autograd-seed=5")
    result.stdout.fnmatch_lines(["autograd: devices=cpu checks=all seed=5"])


def test_option_help_is_grouped_under_autograd(pytester, run_pytest):
    result = run_pytest("--help")
    result.stdout.fnmatch_lines(["*autograd op checks (pytest-autograd)*", "*--autograd-devices=*",
                                 "*--autograd-checks=*", "*--autograd-seed=*"])


def test_disabling_the_plugin_makes_the_marker_unknown(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.autograd_op(op=abs)
        def test_marked():
            pass
        """
    )
    # In a subprocess: pytest remembers known marker names per process.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:autograd", "--strict-markers")
    result.stdout.fnmatch_lines(["*'autograd_op' not found in `markers` configuration option*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not pytester.parseconfig("-p", "no:autograd").pluginmanager.hasplugin("autograd")


def test_disabled_plugin_leaves_the_marked_test_a_plain_test(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.autograd_op(op=abs)
        def test_marked():
            pass
        """
    )
    result = run_pytest("-p", "no:autograd", "-v", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.stdout.fnmatch_lines(["*::test_marked PASSED*"])
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_does_not_import_torch():
    code = "import sys, pytest_autograd.plugin; assert 'torch' not in sys.modules, 'torch was imported'"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


def test_a_session_without_marked_tests_never_imports_torch(pytester, run_pytest):
    pytester.makeconftest(
        """
        import sys

        def pytest_sessionfinish(session):
            loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
            print("torch modules at session end:", len(loaded))
            assert not loaded, f"torch was imported: {loaded[:5]}"
        """
    )
    pytester.makepyfile(
        """
        import pytest

        def test_plain():
            assert 1 + 1 == 2

        @pytest.mark.parametrize("n", [1, 2])
        def test_parametrized(n):
            assert n
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--autograd-checks=gradcheck",
                                           "--autograd-devices=cpu,cuda")
    result.stdout.fnmatch_lines(["autograd: devices=cpu,cuda checks=gradcheck seed=0",
                                 "*torch modules at session end: 0*"])
    result.assert_outcomes(passed=3)


def test_a_project_without_marked_tests_or_options_sees_no_header(pytester, run_pytest):
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run_pytest()
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if line.startswith("autograd")], result.stdout.str()


def test_the_header_appears_after_collection_when_the_session_has_marked_tests(pytester, run_pytest):
    pytester.makepyfile("""
import pytest, torch
from reference_ops import MyReLU

@pytest.mark.autograd_op(op=MyReLU, checks=["gradcheck"])
def test_relu():
    return [(torch.tensor([-1.0, 0.5, 2.0]),)]
""")
    run_pytest().stdout.fnmatch_lines(["collected 1 item", "autograd: devices=cpu checks=all seed=0"])


@pytest.mark.parametrize("given", [["--autograd-seed=5"], ["-o", "autograd_seed=5"]], ids=["option", "ini"])
def test_the_header_appears_at_the_top_when_the_plugin_is_configured(pytester, run_pytest, given):
    pytester.makepyfile("def test_plain():\n    pass\n")
    if given[0] == "-o":
        pytester.makeini("[pytest]\nautograd_seed = 5\n")
        given = []
    run_pytest(*given).stdout.fnmatch_lines(["autograd: devices=cpu checks=all seed=5", "collected 1 item"])
