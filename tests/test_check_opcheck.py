"""opcheck: torch.library.opcheck on registered operators, failures named by opcheck test."""

import pytest
import torch

from pytest_autograd.engine.api import run_checks
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


ROW_SUM = """
import pytest
import torch
from reference_ops.transforms import row_sum, row_sum_default_dtype_fake


@pytest.mark.autograd_op(op={op})
def test_op():
    return [(torch.randn(3, 4),), (torch.randn(2, 5),)]
"""


def test_a_fake_impl_in_the_default_dtype_fails_on_the_float64_copy_of_float32_samples(pytester):
    pytester.makepyfile(test_ops=ROW_SUM.format(op="row_sum_default_dtype_fake"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--autograd-checks=opcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*opcheck failed for pytest_autograd_ref::row_sum_default_dtype_fake: fake tensor",
        "*check opcheck, device cpu, dtype float64, sample 0",
        "*Dtypes torch.float64 and torch.float32 are not equal*",
        "*opcheck ran in: float32, float64 (the last one failed)",
        "*hint: the fake impl's output differs from the kernel's*",
    ])


def test_a_fake_impl_keeping_the_input_dtype_passes_in_every_dtype(pytester):
    pytester.makepyfile(test_ops=ROW_SUM.format(op="row_sum"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--autograd-checks=opcheck")
    result.assert_outcomes(passed=1)


def test_dtypes_the_kernel_refuses_are_left_out_not_failed():
    from pytest_autograd.checks.opcheck import other_dtype_copies

    @torch.library.custom_op("pytest_autograd_test::float_only_double", mutates_args=())
    def float_only_double(x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.float64):
            raise NotImplementedError(f"double not implemented for {x.dtype}")
        return x * 2

    float_only_double.register_fake(lambda x: torch.empty_like(x))
    float_only_double.register_autograd(lambda ctx, grad: grad * 2)
    assert [dtype for dtype, _ in other_dtype_copies(__import__("pytest_autograd").Sample(torch.randn(2)))] == [
        torch.float64, torch.float16, torch.bfloat16]
    outcomes = run_checks(float_only_double, torch.randn(3), checks="opcheck")
    assert [o.status for o in outcomes] == ["passed"], outcomes


@pytest.mark.parametrize("packet", ["torch.ops.aten.sin", "torch.ops.aten.add"])
def test_an_overload_packet_with_several_overloads_is_resolved_from_the_samples(pytester, packet):
    pytester.makepyfile(test_ops=f"""
import pytest
import torch

@pytest.mark.autograd_op(op={packet}, checks=["opcheck"])
def test_op():
    return [(torch.randn(3), torch.randn(3))] if "add" in "{packet}" else [(torch.randn(3),)]
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1)
