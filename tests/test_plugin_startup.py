"""What a project pays for having the plugin installed when it has no autograd tests: the modules imported.

Every pytest session of an environment that installs the plugin imports it. Its cost is the code it
loads (compiled on every run where no bytecode is cached), so what is guarded here is the list of the
package's modules such a session imports: those that declare the options and hooks and build the
registry of checks, never torch, the engine's cases and checks, or the adapter's item runner. The time
itself is measured by ``benchmarks/bench_startup.py`` (see docs/index.md).
"""

import json
import subprocess
import sys

# The package's modules a session without marked tests may import; a new one here costs every such session.
START_UP = {
    "pytest_autograd",
    "pytest_autograd.plugin",
    "pytest_autograd.pytest_adapter",
    "pytest_autograd.pytest_adapter.hooks",
    "pytest_autograd.pytest_adapter.hookspecs",
    "pytest_autograd.pytest_adapter.keys",
    "pytest_autograd.pytest_adapter.fixtures",
    "pytest_autograd.pytest_adapter.positional_op",
    "pytest_autograd.pytest_adapter.settings",
    "pytest_autograd.pytest_adapter.timeout",
    "pytest_autograd.pytest_adapter.shrinking",
    "pytest_autograd.pytest_adapter.builtin_checks",
    "pytest_autograd.pytest_adapter.bench",
    "pytest_autograd.pytest_adapter.reporting",
    "pytest_autograd.engine",
    "pytest_autograd.engine.defaults",
    "pytest_autograd.engine.devices",
    "pytest_autograd.engine.outcomes",
    "pytest_autograd.engine.registry",
    "pytest_autograd.engine.check_scope",
    "pytest_autograd.engine.builtin",
    "pytest_autograd.checks",
    "pytest_autograd.bench",
    "pytest_autograd.bench.defaults",
    "pytest_autograd.engine.isolate_modes",  # --autograd-isolate's modes and help
}
# ... once there is a test to run, the check that no marker on it would leave an op unchecked, and where
# pytest shows a header (no -q), whether it has the plugin's lines.
PER_SESSION = {"pytest_autograd.pytest_adapter.marker_misuse", "pytest_autograd.pytest_adapter.header"}
HEAVY = ("torch", "numpy", "triton", "matplotlib")

LOADED = """
import json, sys
print("LOADED " + json.dumps(sorted(name for name in sys.modules
                                    if name.split(".")[0] in ("pytest_autograd",) + {heavy!r})))
"""


def loaded_modules(output):
    line = next(line for line in output.splitlines() if "LOADED " in line)  # after pytest's progress dots
    return set(json.loads(line.split("LOADED ", 1)[1]))


def test_importing_the_plugin_imports_only_the_modules_that_declare_options_and_hooks():
    code = f"import pytest, pytest_autograd.plugin, pytest_autograd.pytest_adapter.bench\n{LOADED.format(heavy=HEAVY)}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert loaded_modules(done.stdout) - START_UP == set()


def test_a_session_without_marked_tests_imports_only_the_start_up_modules(pytester):
    pytester.makeconftest("import sys\n\ndef pytest_sessionfinish(session):\n"
                          + "".join(f"    {line}\n" for line in LOADED.format(heavy=HEAVY).strip().splitlines()))
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def number():
            return 3

        def test_plain(number):
            assert number == 3

        @pytest.mark.parametrize("n", [1, 2])
        def test_parametrized(n):
            assert n

        class TestGroup:
            def test_method(self):
                assert True
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=4)
    assert loaded_modules(result.stdout.str()) - START_UP - PER_SESSION == set()


def test_the_bench_and_report_plugins_are_registered_right_after_the_entry_point(pytester):
    names = [name for name, _ in pytester.parseconfig().pluginmanager.list_name_plugin()]
    start = names.index("autograd")
    assert names[start:start + 3] == ["autograd", "pytest_autograd.pytest_adapter.bench",
                                      "pytest_autograd.pytest_adapter.reporting"]


def test_disabling_the_plugin_also_leaves_its_bench_and_report_plugins_out(pytester):
    plugins = pytester.parseconfig("-p", "no:autograd").pluginmanager.get_plugins()
    assert [plugin for plugin in plugins if getattr(plugin, "__name__", "").startswith("pytest_autograd")] == []
