"""precision: low-precision runs against a float64 truth, with reference='s error as the budget."""

import pytest
import torch

import pytest_autograd.checks.precision  # noqa: F401
import reference_ops.transforms  # noqa: F401
from pytest_autograd.engine.case import OpCase
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.checks._transforms import check_dtypes

OPS = """
import pytest
import torch
from reference_ops import LinearFunction
from reference_ops.transforms import LinearHalfMatmul, NaiveVariance, naive_variance_reference


def variance_reference(x):
    return x.var(-1, unbiased=False)


@pytest.mark.autograd_op(op={op}{marker})
def test_op():
    return {samples}
"""
LINEAR = "[(torch.randn(8, 64), torch.randn(16, 64), torch.randn(16))]"
VARIANCE = "[(1000 + torch.randn(4, 32),)]"  # mean far above the spread: mean(x^2) - mean(x)^2 cancels


def run(pytester, op, marker="", samples=LINEAR):
    pytester.makepyfile(test_ops=OPS.format(op=op, marker=marker, samples=samples))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=precision", "-rs")


def test_a_float32_path_through_bfloat16_fails_stating_both_errors(pytester):
    result = run(pytester, "LinearHalfMatmul", ", reference=torch.nn.functional.linear")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output in float32: the op's error * exceeds 2 x the reference's error *",
        "*check precision, device cpu, dtype float32, sample 0",
        "*worst element: output[[]*]: float64 *, got *",
        "*op error *, reference error * (each: max abs error / max |float64 value|); budget 2 x * + floor * = *",
        "*hint: an error the size of 16-bit rounding*",
    ])


def test_without_a_reference_the_bfloat16_path_fails_the_float32_tolerance(pytester):
    result = run(pytester, "LinearHalfMatmul")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*output in float32 is off from float64 by *, more than the float32 tolerance",
                                 "*error * > tolerance 1e-05 for float32*"])


def test_precision_k_widens_the_budget(pytester):
    run(pytester, "LinearHalfMatmul", ", reference=torch.nn.functional.linear, precision_k=1e6").assert_outcomes(
        passed=1)


def test_a_correct_linear_passes_with_and_without_reference(pytester):
    run(pytester, "LinearFunction", ", reference=torch.nn.functional.linear").assert_outcomes(passed=1)
    run(pytester, "LinearFunction").assert_outcomes(passed=1)


def test_an_op_as_imprecise_as_its_reference_passes_in_float32_and_bfloat16(pytester):
    marker = ", reference=naive_variance_reference, dtypes=['float64', 'float32', 'bfloat16']"
    run(pytester, "NaiveVariance", marker, VARIANCE).assert_outcomes(passed=1)


def test_the_same_op_fails_against_an_accurate_reference(pytester):
    result = run(pytester, "NaiveVariance", ", reference=variance_reference", VARIANCE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*output in float32: the op's error * exceeds 2 x the reference's error *"])


def test_an_unknown_dtype_name_is_a_usage_error(pytester):
    result = run(pytester, "LinearFunction", ", dtypes=['float8']")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*dtypes= names 'float8', not a floating dtype*"])


def _case(**options):
    return OpCase(op=None, samples=[], options=options)


def test_default_dtypes_are_float32_on_cpu_and_add_16_bit_ones_on_cuda():
    assert check_dtypes(_case(), "cpu") == ([torch.float32], False)
    cuda, explicit = check_dtypes(_case(), "cuda")
    assert cuda[:2] == [torch.float32, torch.float16] and not explicit
    assert check_dtypes(_case(dtypes="bfloat16"), "cpu") == ([torch.bfloat16], True)
    with pytest.raises(UsageProblem):
        check_dtypes(_case(dtypes=[torch.int32]), "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16/bfloat16 defaults apply on CUDA only")
def test_on_cuda_a_correct_linear_passes_in_every_default_dtype(pytester):
    pytester.makepyfile(test_ops=OPS.format(op="LinearFunction", marker=", reference=torch.nn.functional.linear",
                                            samples=LINEAR))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=precision",
                                          "--autograd-devices=cuda")
    result.assert_outcomes(passed=1)


def test_a_reference_that_raises_is_blamed_instead_of_the_op(pytester):
    result = run(pytester, "LinearFunction", marker=", reference=lambda x, w: x @ w.T")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=lambda at test_ops.py:* raised TypeError in its forward: *takes 2 positional arguments but 3 were given",
        "  check precision, device cpu, dtype float32, sample 0",
    ])


def test_a_16_bit_dtype_refused_by_torch_or_by_a_triton_kernel_compile_is_recognised_as_unsupported():
    from pytest_autograd.checks._transforms import unsupported_dtype
    from pytest_autograd.engine.execution import OpRaised

    class CompilationError(Exception):  # triton.compiler.errors.CompilationError keeps the inner error's repr
        pass

    def raised(error):
        return OpRaised("forward", error)

    triton_refusal = ValueError("Expected dtype ['fp32', 'fp64'] but got bf16")
    nested = CompilationError("at 6:14:\n    t = tl.sigmoid(u)\n", repr(CompilationError("at 1:4:", repr(triton_refusal))))
    try:
        try:
            raise triton_refusal
        except ValueError as inner:
            raise CompilationError("at 6:14: <source>") from inner
    except CompilationError as outer:
        chained = outer

    assert unsupported_dtype(raised(RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')))
    assert unsupported_dtype(raised(nested))
    assert unsupported_dtype(raised(chained))
    assert not unsupported_dtype(raised(ValueError("Expected dtype ['fp32'] but got fp64")))
    assert not unsupported_dtype(raised(RuntimeError("shape mismatch")))


def test_a_wrong_formula_in_a_bfloat16_kernel_is_not_blamed_on_a_bfloat16_reduction():
    import torch

    from pytest_autograd import run_checks
    from reference_ops.low_precision import SwishBfloat16OnlyDroppedTerm, swish_reference

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    outcome, = run_checks(SwishBfloat16OnlyDroppedTerm, x, reference=swish_reference, checks=["precision"])
    assert outcome.status == "failed"
    assert "is far beyond rounding in bfloat16 on the sample itself: a wrong formula is more likely" in outcome.detail
    assert "a reduction accumulated in bfloat16" not in outcome.detail
