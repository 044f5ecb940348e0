"""What the plugin says and refuses when Triton's interpreter (TRITON_INTERPRET=1) is on."""

import pytest

from pytest_autograd.engine.triton_interpreter import interpreted_kernels_reason, interpreter_on

BENCH = ["--autograd-checks=bench", "--autograd-bench", "--autograd-bench-budget=0.01",
         "--autograd-bench-warmup=0.001", "-rs"]

TRITON_TEST = """
import pytest
from reference_ops.triton_ops import TritonRMSNorm, rms_norm_reference, rms_norm_samples

@pytest.mark.autograd_op(op=TritonRMSNorm, reference=rms_norm_reference, double_backward=False)
def test_rms_norm():
    return rms_norm_samples()[:1]
"""

TORCH_TEST = """
import pytest, torch
from reference_ops import Cube, cube_reference

@pytest.mark.autograd_op(op=Cube, reference=cube_reference)
def test_cube():
    return [torch.randn(16)]
"""


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_the_header_says_when_triton_kernels_run_in_the_interpreter(pytester, run_pytest, monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    pytester.makepyfile("def test_nothing():\n    pass\n")
    run_pytest("--collect-only", "--autograd-seed=0").stdout.fnmatch_lines([
        "autograd: devices=cpu checks=all seed=0",
        "autograd: TRITON_INTERPRET=1, Triton kernels run in Triton's CPU interpreter: every check judges their "
        "numbers, bench refuses to time them",
    ])


@pytest.mark.parametrize("value", [None, "0", ""])
def test_the_header_says_nothing_of_triton_without_the_interpreter(pytester, run_pytest, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run_pytest("--collect-only")
    result.stdout.no_fnmatch_line("*TRITON_INTERPRET*")


def test_an_op_that_launches_no_kernel_is_not_refused_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreted_kernels_reason(lambda: None) is None


needs_interpreter = pytest.mark.skipif(
    not interpreter_on(), reason="needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")


@needs_interpreter
def test_bench_refuses_to_time_interpreted_triton_kernels_and_says_why(pytester):
    pytest.importorskip("triton", reason="triton is not installed")
    pytester.makepyfile(TRITON_TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", *BENCH)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "*TRITON_INTERPRET=1: the op launches Triton kernels, which run in Triton's numpy interpreter here, so a "
        "timing would measure the interpreter, not the kernel; benchmark on a GPU without TRITON_INTERPRET*",
    ])


@needs_interpreter
def test_bench_still_times_a_plain_torch_op_under_the_interpreter(pytester):
    pytest.importorskip("triton", reason="triton is not installed")
    import triton.runtime.interpreter  # noqa: F401  (what the refusal looks for)

    pytester.makepyfile(TORCH_TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark", *BENCH)
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*numpy interpreter*")


NATIVE_KERNEL_TEST = """
import pytest, torch, triton, triton.language as tl

@triton.jit
def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)

class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        double_kernel[(triton.cdiv(x.numel(), 8),)](x, y, x.numel(), BLOCK=8)
        return y

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad

@pytest.mark.autograd_op(op=Double, checks=["gradcheck"])
def test_double():
    return (torch.randn(5),)
"""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU runs the kernel natively")
def test_a_triton_kernel_given_cpu_tensors_without_the_interpreter_is_told_to_set_it(pytester, monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pytester.makepyfile(NATIVE_KERNEL_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's forward raised RuntimeError*",
        "*hint: a Triton kernel got CPU tensors: without a GPU, run it in Triton's interpreter by setting "
        "TRITON_INTERPRET=1 before triton is imported*",
    ])


KERNEL_THE_INTERPRETER_REFUSES = """
import pytest, torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x * factor.to(tl.float32), mask=mask)  # compiles; the interpreter has a float here


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), 2.0, BLOCK=16)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@pytest.mark.autograd_op(op=Scale, reference=lambda x: x * 2)
def test_scale():
    return [(torch.randn(40),)]
"""


def test_a_kernel_the_interpreter_cannot_run_is_skipped_by_every_check_never_blamed(pytester, run_pytest):
    pytest.importorskip("triton")
    if not interpreter_on():
        pytest.skip("needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    pytester.makepyfile(test_kernel=KERNEL_THE_INTERPRETER_REFUSES)
    result = run_pytest("-rs")
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes and "passed" not in outcomes, result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED [[]*[]] test_kernel.py:*: Triton's interpreter cannot run this op's kernel "
                                 "(AttributeError(\"'float' object has no attribute 'to'\")): a limit of "
                                 "TRITON_INTERPRET=1, not a verdict on the kernel; run the checks on a GPU without it"])


BFLOAT16_ONLY_SQUARE = """
import pytest, torch
import triton
import triton.language as tl


@triton.jit
def square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x * x, mask=mask)  # bfloat16 arithmetic, right on a GPU


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.bfloat16:
            raise TypeError("square_kernel takes bfloat16 tensors only")
        ctx.save_for_backward(x)
        y = torch.empty_like(x)
        square_kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)
        return y

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x


@pytest.mark.autograd_op(op=Square, reference=lambda x: x * x, checks=["gradcheck", "reference"])
def test_square():
    return [(torch.randn(40, dtype=torch.bfloat16),)]
"""


def test_a_bfloat16_kernel_is_not_failed_for_the_interpreters_bfloat16_arithmetic(pytester, run_pytest):
    pytest.importorskip("triton")
    if not interpreter_on():
        pytest.skip("needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    pytester.makepyfile(test_square=BFLOAT16_ONLY_SQUARE)
    result = run_pytest("-rs")
    assert "failed" not in result.parseoutcomes(), result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED [[]*[]] test_square.py:*: TRITON_INTERPRET=1: Triton's interpreter computes "
                                 "bfloat16 arithmetic wrongly here (its self-test: x * x + x off by *)*judge "
                                 "bfloat16 on a GPU"])


def test_the_interpreter_self_test_judges_float32_right():
    pytest.importorskip("triton")
    if not interpreter_on():
        pytest.skip("needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from pytest_autograd.engine.triton_interpreter import interpreter_arithmetic_problem

    assert interpreter_arithmetic_problem("float32") is None
    assert interpreter_arithmetic_problem("float64") is None


# ---------------------------------------------------------------------------
# The checks that explore: a mismatch in a dtype the interpreter computes wrongly is noted, not failed
# ---------------------------------------------------------------------------

SCALE_COLUMNS_IN_BFLOAT16 = """
import pytest, torch
from reference_ops.sizes_triton import *


def bfloat16_samples():
    return [tuple(a.to(torch.bfloat16) for a in s) for s in SAMPLES(torch.Generator().manual_seed(0))]


# aliasing judges the user's own sample, and its failure carries no tensors to tell the interpreter's garbage by
@pytest.mark.autograd_op(op=TritonScaleColumns, reference=scale_columns_reference, skip=["aliasing"])
def test_scale():
    return bfloat16_samples()


@pytest.mark.autograd_op(op=TritonScaleColumnsGridFloor, reference=scale_columns_reference, skip=["aliasing"])
def test_scale_grid_floor():
    return bfloat16_samples()
"""


def test_bfloat16_samples_of_a_kernel_are_noted_where_extreme_meets_the_interpreter_and_judged_in_float64_by_sizes(
        pytester, run_pytest):
    pytest.importorskip("triton")
    if not interpreter_on():
        pytest.skip("needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    pytester.makepyfile(test_ops=SCALE_COLUMNS_IN_BFLOAT16)
    result = run_pytest("-rf")
    failed = [line.split(" ")[1] for line in result.outlines if line.startswith("FAILED")]
    assert failed == ["test_ops.py::test_scale_grid_floor[sizes-cpu]"], result.stdout.str()
    result.stdout.fnmatch_lines([
        "*AutogradNote: sample 0: extreme: not judged at max |x| = * in bfloat16: gradient w.r.t. `x` is nan where "
        "the reference in float64 gives *; TRITON_INTERPRET=1: Triton's interpreter computes bfloat16 arithmetic "
        "wrongly here (its self-test: *), so a bfloat16 mismatch of an op that launches Triton kernels says nothing "
        "about the kernel; judge bfloat16 on a GPU",
    ])
    result.stdout.fnmatch_lines(["gradient w.r.t. `x` is wrong when dim 0 (size 8 in your sample) is 9",
                                 "  check sizes, device cpu, dtype float64, sample 0"])  # float64: computed right


def test_a_size_variants_mismatch_in_a_dtype_the_interpreter_computes_wrongly_is_noted_not_failed(monkeypatch):
    pytest.importorskip("triton")
    if not interpreter_on():
        pytest.skip("needs triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    import torch

    from pytest_autograd import Sample
    from pytest_autograd.checks.base import CheckContext
    from pytest_autograd.checks.sizes import check
    from pytest_autograd.engine import triton_interpreter
    from pytest_autograd.engine.case import build_case
    from pytest_autograd.engine.outcomes import CheckSkipped
    from reference_ops.sizes_triton import SAMPLES, TritonScaleColumnsGridFloor, scale_columns_reference

    # as if the interpreter computed float64 wrongly, as it does bfloat16: the sizes check judges this kernel in float64
    monkeypatch.setitem(triton_interpreter._SELF_TEST, "float64", "x * x + x off by 7 on values of magnitude 3")
    samples = [Sample(*sample) for sample in SAMPLES(torch.Generator().manual_seed(0))]
    case = build_case({"op": TritonScaleColumnsGridFloor, "reference": scale_columns_reference}, samples)
    context = CheckContext("sizes", case, "cpu", seed=0)
    with triton_interpreter.watching_interpreted_dtypes():
        try:
            check.run(context)  # a failure would raise CheckFailure
        except CheckSkipped:  # when no variant but the noted ones could be judged in time
            pass
    assert any(note.startswith("sample 0: sizes: not judged when dim 0 of `x` (size 8 in your sample) is 9: gradient "
                               "w.r.t. `x` is off (grad x[") and note.endswith(
        "; TRITON_INTERPRET=1: Triton's interpreter computes float64 arithmetic wrongly here (its self-test: x * x + x "
        "off by 7 on values of magnitude 3), so a float64 mismatch of an op that launches Triton kernels says nothing "
        "about the kernel; judge float64 on a GPU") for note in context.notes), context.notes
