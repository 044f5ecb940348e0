"""Third-party checks register through pytest_autograd_register_checks, exactly like the built-in ones.

The conftest used here is the example of docs/writing_checks.md, read from
the page itself so that the documented code is the tested code.
"""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing_checks.md"

OPS = """
import pytest
import torch

@pytest.mark.autograd_op(op=torch.reciprocal)
def test_reciprocal():
    return [(torch.tensor([1.0, 2.0, 4.0]),), (torch.tensor([1.0, 2.0, 0.0]),)]

@pytest.mark.autograd_op(op=torch.exp)
def test_exp():
    return [(torch.tensor([1.0, -2.0]),)]
"""


def documented_conftest():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    return blocks[0]


def test_the_documented_check_gets_its_own_items(pytester, run_pytest):
    pytester.makeconftest(documented_conftest())
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--collect-only", "-q", "--autograd-checks=finite,gradcheck")
    result.stdout.fnmatch_lines([
        "test_ops.py::test_reciprocal[[]gradcheck-cpu[]]",
        "test_ops.py::test_reciprocal[[]finite-cpu[]]",
        "test_ops.py::test_exp[[]gradcheck-cpu[]]",
        "test_ops.py::test_exp[[]finite-cpu[]]",
    ])


def test_the_documented_check_passes_a_good_op_and_fails_a_bad_one_with_a_report(pytester, run_pytest):
    pytester.makeconftest(documented_conftest())
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=finite", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_exp[[]finite-cpu[]] PASSED*",
        "output has 1 non-finite element(s)",
        "  check finite, device cpu, dtype float32, sample 1",
        "  output: output",
        "  worst element: output[[]2[]]: inf",
        "  hint: guard divisions and logarithms against zero inputs",
        "  seed: *",
        '  rerun: pytest "test_ops.py::test_reciprocal[[]finite-cpu[]]" --autograd-seed=0',
    ])


def test_a_registered_check_declares_its_marker_keywords(pytester, run_pytest):
    pytester.makeconftest(documented_conftest())
    pytester.makepyfile(
        """
        import pytest
        import torch

        def with_bad_second_output(x):
            return x * 2, x / 0

        @pytest.mark.autograd_op(op=with_bad_second_output, finite_outputs=[0])
        def test_first_output_only():
            return [(torch.ones(2),)]

        @pytest.mark.autograd_op(op=with_bad_second_output, finite_outputs=[])
        def test_nothing_to_check():
            return [(torch.ones(2),)]
        """
    )
    result = run_pytest("--autograd-checks=finite", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * finite_outputs=[[][]] on the marker: nothing to check"])


def test_without_the_registration_its_keywords_and_name_are_unknown(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.autograd_op(op=torch.exp, finite_outputs=[0])
        def test_exp():
            return [(torch.ones(2),)]
        """
    )
    result = run_pytest("--autograd-checks=gradcheck")
    result.stdout.fnmatch_lines(["*unknown @pytest.mark.autograd_op argument(s) finite_outputs; *"])
    result = run_pytest("--autograd-checks=finite")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --autograd-checks: unknown check(s) 'finite'; known checks are: *"])


OPT_IN_CONFTEST = """
import pytest
from pytest_autograd import Check

class AlwaysFails(Check):
    name = "strict"
    description = "fails every op: shows how opt-in items behave"
    default = False

    def run(self, context):
        for index, sample in context.samples():
            context.fail("strict says no")

def pytest_autograd_register_checks(registry):
    registry.add(AlwaysFails())
"""


def test_an_opt_in_check_is_skipped_unless_selected(pytester, run_pytest):
    pytester.makeconftest(OPT_IN_CONFTEST)
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("-rs", "-k", "exp", "--autograd-checks=gradcheck,strict")
    result.assert_outcomes(passed=1, failed=1)
    result = run_pytest("-rs", "-k", "exp and strict")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED * strict is opt-in: select it with --autograd-checks=strict or checks=[[]...[]] on the marker"])


def test_an_opt_in_check_selected_on_the_marker_runs_and_its_rerun_command_selects_it(pytester, run_pytest):
    pytester.makeconftest(OPT_IN_CONFTEST)
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.autograd_op(op=torch.exp, checks=["strict"])
        def test_exp():
            return [(torch.ones(2),)]
        """
    )
    result = run_pytest("--autograd-seed=9")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "strict says no",
        '  rerun: pytest "test_*.py::test_exp[[]strict-cpu[]]" --autograd-seed=9 --autograd-checks=strict',
    ])


def test_a_lazily_registered_check_module_is_imported_when_needed(pytester, run_pytest):
    pytester.makepyfile(
        my_lazy_check="""
        from pytest_autograd import Check

        class Counts(Check):
            name = "lazy_counts"
            def run(self, context):
                for index, sample in context.samples():
                    pass

        check = Counts()
        """
    )
    pytester.makeconftest(
        """
        def pytest_autograd_register_checks(registry):
            registry.add_lazy("lazy_counts", "my_lazy_check")
        """
    )
    pytester.makepyfile(test_ops=OPS)
    pytester.syspathinsert()
    result = run_pytest("--autograd-checks=lazy_counts", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_reciprocal[[]lazy_counts-cpu[]] PASSED*"])


def test_adjust_samples_hook_replaces_the_samples_of_an_item(pytester, run_pytest):
    pytester.makeconftest(
        documented_conftest()
        + """

def pytest_autograd_adjust_samples(case, device):
    if case.name == "torch.exp":
        return [(torch.tensor([1000.0]),)]
    return None
"""
    )
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=finite")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*test_exp[[]finite-cpu[]]*", "output has 1 non-finite element(s)",
                                 "  check finite, device cpu, dtype float32, sample 0"])


def test_the_documented_conftest_works_with_the_plugin_disabled(pytester, run_pytest):
    pytester.makeconftest(documented_conftest())
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result = run_pytest("-p", "no:autograd")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)


def test_the_documented_conftest_works_when_plugins_are_not_autoloaded(pytester, run_pytest, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(documented_conftest())
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result = run_pytest()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)


# --- where a check registered in a conftest.py applies ------------------------------------------

FINITE_CONFTEST = """
import pytest, torch
from pytest_autograd import Check

class Finite(Check):
    name = "finite"

    def run(self, context):
        for index, sample in context.samples():
            for output in context.run_op(context.prepare(sample, requires_grad=False)):
                if not bool(torch.isfinite(output).all()):
                    context.fail("output is not finite")

@pytest.hookimpl(optionalhook=True)
def pytest_autograd_register_checks(registry):
    registry.add(Finite())
"""

MARKED = """
import pytest, torch

@pytest.mark.autograd_op(op=torch.exp{extra})
def test_exp():
    return (torch.tensor([1.0, -2.0]),)
"""


def three_directories(pytester, extra_in_c=""):
    """sub_b registers ``finite`` in its conftest.py; sub_a is collected before it, sub_c after."""
    for name in ("sub_a", "sub_b", "sub_c"):
        directory = pytester.mkdir(name)
        extra = extra_in_c if name == "sub_c" else ""
        (directory / f"test_{name}.py").write_text(MARKED.format(extra=extra))
    (pytester.path / "sub_b" / "conftest.py").write_text(FINITE_CONFTEST)


def finite_items(result):
    return sorted(line for line in result.outlines if "finite-cpu" in line)


def test_a_check_from_a_sub_directory_conftest_applies_to_that_directory_only(pytester, run_pytest):
    three_directories(pytester)
    from_root = finite_items(run_pytest("--collect-only", "-q"))
    assert from_root == ["sub_b/test_sub_b.py::test_exp[finite-cpu]"]
    in_other_order = finite_items(run_pytest("--collect-only", "-q", "sub_c", "sub_b", "sub_a"))
    assert in_other_order == from_root


def test_a_check_from_a_sub_directory_conftest_can_be_selected_from_the_rootdir(pytester, run_pytest):
    three_directories(pytester)
    result = run_pytest("--autograd-checks=finite", "-v")
    result.stdout.fnmatch_lines(["*sub_b/test_sub_b.py::test_exp[[]finite-cpu[]] PASSED*"])
    result.assert_outcomes(passed=1, skipped=2)
    from_inside = run_pytest("--autograd-checks=finite", "sub_b")
    from_inside.assert_outcomes(passed=1)


def test_a_check_named_outside_the_directory_of_its_conftest_fails_that_test_naming_it(pytester, run_pytest):
    three_directories(pytester, extra_in_c=', checks=["finite"]')
    result = run_pytest()
    assert result.parseoutcomes()["failed"] == 1  # that test only: the other directories' tests run
    assert result.parseoutcomes()["passed"] > 0
    result.stdout.fnmatch_lines(["*sub_c/test_sub_c.py::test_exp: checks= names check 'finite', which "
                                 "*sub_b/conftest.py registers for the tests in its directory only*"])


def test_an_unknown_check_is_still_refused_after_collection(pytester, run_pytest):
    three_directories(pytester)
    result = run_pytest("--autograd-checks=finit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown check(s) 'finit' (did you mean finite?)*"])
