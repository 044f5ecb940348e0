"""compile: torch.compile(op) against eager; graph breaks named. Opt-in, so every run selects it.

Compilation is slow on small CPUs: most tests use the cheap aot_eager
backend (dynamo and AOTAutograd, no code generation); the inductor test,
which needs inductor's compiled kernels to show the bug, is marked slow.
"""

import warnings

import pytest
import torch

import pytest_autograd.checks.compile  # noqa: F401
from pytest_autograd.engine.api import run_checks
from reference_ops import Cube
from reference_ops.transforms import CubeValidatesInput, scaled_row_sum

OPS = """
import pytest
import torch
from reference_ops import Cube
from reference_ops.transforms import CubeValidatesInput, scaled_row_sum, scaled_row_sum_default_dtype_fake


@pytest.mark.autograd_op(op={op}{marker})
def test_op():
    return [(torch.randn(3, 4, dtype={dtype}),)]
"""
AOT_EAGER = ", compile_backend='aot_eager'"


@pytest.fixture(scope="module", autouse=True)
def compile_machinery_imported():
    """Import what torch.compile loads lazily before any in-process run.

    pytester drops modules first imported during a run; torch's compile
    stack registers global state on import and refuses a second import.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in (Cube, CubeValidatesInput):
            run_checks(op, torch.randn(3), checks="compile", compile_backend="aot_eager", compile_fullgraph=True)


@pytest.fixture
def inductor_imported():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_checks(scaled_row_sum, torch.randn(3, 4, dtype=torch.float64), checks="compile")


def run(pytester, op, marker="", dtype="torch.float32", checks="--autograd-checks=compile"):
    pytester.makepyfile(test_ops=OPS.format(op=op, marker=marker, dtype=dtype))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", checks, "-rs")


def test_a_data_dependent_branch_fails_fullgraph_naming_the_break(pytester):
    result = run(pytester, "CubeValidatesInput", AOT_EAGER + ", compile_fullgraph=True")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*torch.compile(op, fullgraph=True) raised *",
        "*check compile, device cpu, dtype float32, sample 0",
        "*graph break: * at *transforms.py:* in forward: `if not torch.isfinite(x).all():`",
        "*hint: fullgraph=True needs the op traceable end to end*",
    ])


def test_a_failing_compile_report_holds_no_empty_torch_trace_log_lines(pytester):
    result = run(pytester, "CubeValidatesInput", AOT_EAGER + ", compile_fullgraph=True")
    result.assert_outcomes(failed=1)
    assert "torch.__trace" not in result.stdout.str()


def test_without_fullgraph_the_break_is_a_warning_and_the_op_passes(pytester):
    result = run(pytester, "CubeValidatesInput", AOT_EAGER)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*GraphBreakWarning: compile: torch.compile(CubeValidatesInput) has 1 graph break(s)*"])


def test_a_traceable_function_passes_fullgraph(pytester):
    run(pytester, "Cube", AOT_EAGER + ", compile_fullgraph=True").assert_outcomes(passed=1)


def test_compile_is_opt_in(pytester):
    result = run(pytester, "Cube", checks="-k compile")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*compile is opt-in: select it with --autograd-checks=compile*"])


@pytest.mark.slow
def test_a_fake_impl_in_the_default_dtype_makes_inductor_differ_from_eager(pytester, inductor_imported):
    pytester.makepyfile(test_ops=OPS.format(op="scaled_row_sum_default_dtype_fake", marker="", dtype="torch.float64")
                        + OPS.format(op="scaled_row_sum", marker="", dtype="torch.float64").replace(
                            "def test_op", "def test_twin"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=compile")
    result.assert_outcomes(failed=1, passed=1)
    # Inductor before torch 2.15 reads the float64 result as float32; from 2.15 on it checks and raises.
    result.stdout.re_match_lines([
        r".*test_op.*",
        r"(output of torch\.compile\(op\) differs from eager"
        r"|torch\.compile\(op\) raised \w+: expected dtype torch\.float32 but got torch\.float64)$",
        r"  check compile, device cpu, dtype float64, sample 0$",
        r".*hint: eager and compiled code disagree: .*fake impl.*",
    ])
