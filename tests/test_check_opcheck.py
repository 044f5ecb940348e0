"""opcheck: torch.library.opcheck on registered operators, failures named by opcheck test."""

import pytest
import torch

from pytest_autograd.imperative import run_checks
from reference_ops.transforms import scaled_sin

OPS = """
import pytest
import torch
from reference_ops import ElementwiseMul
from reference_ops.transforms import scaled_sin, scaled_sin_mutates_input, scaled_sin_no_fake


@pytest.mark.autograd_op(op={op})
def test_op():
    return [(torch.randn(3, 4), 2.0), (torch.randn(5), -0.5)]
"""


@pytest.fixture(scope="module", autouse=True)
def torch_machinery_imported():
    """Run the check once before any in-process pytester run: pytester drops modules first
    imported during a run, and parts of torch refuse to be imported twice."""
    run_checks(scaled_sin, torch.randn(3), 2.0, checks="opcheck")


def run(pytester, op):
    pytester.makepyfile(test_ops=OPS.format(op=op))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=opcheck", "-rs")


def test_a_custom_op_without_fake_impl_fails_the_fake_tensor_test(pytester):
    result = run(pytester, "scaled_sin_no_fake")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*opcheck failed for pytest_autograd_ref::scaled_sin_no_fake: fake tensor, aot dispatch",
        "*check opcheck, device cpu, dtype float32, sample 0",
        "*fake tensor (test_faketensor: checks *): RuntimeError: There was no fake impl registered*",
        "*aot dispatch (test_aot_dispatch_dynamic): same error as fake tensor",
        "*hint: register a fake impl*register_fake*",
    ])


def test_a_custom_op_mutating_an_undeclared_input_fails_the_schema_test(pytester):
    result = run(pytester, "scaled_sin_mutates_input")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*opcheck failed for pytest_autograd_ref::scaled_sin_mutates_input: schema",
        "*schema (test_schema: *): RuntimeError: Argument x is not defined as mutable but was mutated",
        "*hint: declare every argument the kernel writes to: *mutates_args*",
    ])


def test_a_complete_custom_op_passes_as_def_and_as_torch_ops_packet(pytester):
    run(pytester, "scaled_sin").assert_outcomes(passed=1)
    run(pytester, "torch.ops.pytest_autograd_ref.scaled_sin").assert_outcomes(passed=1)


def test_an_autograd_function_is_skipped_with_the_reason(pytester):
    result = run(pytester, "ElementwiseMul")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*op is not a torch.library operator*"])
