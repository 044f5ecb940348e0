"""Ops that cannot run in float64 are still judged, in their own dtype, and say how.

A float32-only kernel raises on float64 or computes in float32 whatever it
gets; its gradients are judged against the reference's float64 gradients on
the same rounded inputs, or by central differences in float32 whose
tolerance is measured. A wrong backward fails naming the argument; the
correct twin passes every default check.
"""

import pytest

HEADER = """
import pytest
import torch
from reference_ops.low_precision import *
"""


def marked(op, extra=""):
    return HEADER + f"""
@pytest.mark.autograd_op(op={op}{extra})
def test_op():
    return gated_samples()
"""


def run(pytester, run_pytest, op, extra="", *args):
    pytester.makepyfile(test_ops=marked(op, extra))
    return run_pytest("-rs", *args)


@pytest.mark.parametrize("op", ["GatedFloat32Only", "GatedComputesInFloat32", "GatedMixedPrecision"])
@pytest.mark.parametrize("extra", ["", ", reference=gated_reference"])
def test_a_correct_float32_only_op_passes_every_default_check(pytester, run_pytest, op, extra):
    result = run(pytester, run_pytest, op, extra)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert "passed" in outcomes


def test_a_dropped_product_rule_term_fails_gradcheck_by_measured_differences_naming_the_argument(pytester, run_pytest):
    result = run(pytester, run_pytest, "GatedFloat32OnlyDroppedProductTerm", "", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative in float32",
        "  check gradcheck, device cpu, dtype float32, sample 0",
        "  output: all outputs, argument: x",
        "  worst element: grad x* (numerical), got * (analytical)",
        "  abs error * > tolerance * (central differences in float32 at steps *; the error stays at * whatever "
        "the step, so it is the gradient's, not rounding's)",
        "  strategy: gradcheck: the op's forward raises on float64 (RuntimeError: gated_kernel: only float32 is "
        "supported, got torch.float64); judged by central differences in float32 at three step sizes*",
    ], consecutive=True)


def test_a_dropped_product_rule_term_fails_gradcheck_against_the_float64_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, "GatedFloat32OnlyDroppedProductTerm", ", reference=gated_reference",
                 "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` in float32 does not match the reference's float64 gradient",
        "  check gradcheck, device cpu, dtype float32, sample 0",
        "  argument: x",
        "  worst element: grad x* expected * (reference, float64), got *",
        "  normwise error * > budget * (precision_k x the reference's own error * in this dtype, plus 8 ulps)",
        "  strategy: gradcheck: * judged by gradients in float32 against the reference's float64 gradients on the "
        "same rounded inputs",
    ], consecutive=True)


def test_an_op_computing_in_float32_for_float64_inputs_with_a_wrong_backward_fails(pytester, run_pytest):
    result = run(pytester, run_pytest, "GatedComputesInFloat32DroppedProductTerm", "", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative in float32",
        "*strategy: gradcheck: the op returns float32 outputs for float64 inputs; judged by*",
    ])


def test_an_op_computing_part_of_its_forward_in_float32_with_a_wrong_backward_fails_in_float32(pytester,
                                                                                                  run_pytest):
    result = run(pytester, run_pytest, "GatedMixedPrecisionDroppedProductTerm", "", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative in float32",
        "  check gradcheck, device cpu, dtype float32, sample 0",
        "*strategy: gradcheck: the op computes (part of) its forward in float32 for float64 inputs (its float64 "
        "outputs miss input changes below float32's resolution); judged by central differences in float32*",
    ])


def test_an_op_computing_part_of_its_forward_in_float32_passes_saying_it_was_judged_in_float32(pytester,
                                                                                                run_pytest):
    result = run(pytester, run_pytest, "GatedMixedPrecision", "", "--autograd-checks=gradcheck,gradgradcheck,sizes",
                 "-W", "error")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*AutogradNote: gradcheck: the op computes (part of) its forward in "
                                 "float32 for float64 inputs*judged by central differences in float32*"])


def test_the_pass_note_names_the_strategy_used(pytester, run_pytest):
    result = run(pytester, run_pytest, "GatedFloat32Only", "", "--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*AutogradNote: gradcheck: the op's forward raises on float64 (*); judged by central differences in "
        "float32 at three step sizes, tolerance from the measured spread between them",
        "*AutogradNote: gradgradcheck: the op's forward raises on float64 (*); judged by central differences*",
    ])


def test_an_op_that_gives_wrong_float64_results_without_raising_is_declared_with_dtypes(pytester, run_pytest):
    result = run(pytester, run_pytest, "GatedFloat32OnlySilent", "", "--autograd-checks=gradcheck,reference")
    result.assert_outcomes(failed=1, skipped=1)  # float64 runs, silently wrong: caught as a wrong derivative
    declared = run(pytester, run_pytest, "GatedFloat32OnlySilent", ", dtypes=(torch.float32,)")
    assert declared.parseoutcomes().get("failed", 0) == 0, declared.stdout.str()
    declared.stdout.fnmatch_lines(["*AutogradNote: gradcheck: dtypes=(float32) on the marker declares no float64*"])


def test_an_op_raising_in_every_dtype_is_reported_with_its_own_error(pytester, run_pytest):
    pytester.makepyfile(test_ops=HEADER + """
def broken(x):
    raise RuntimeError("kernel launch failed")

@pytest.mark.autograd_op(op=broken)
def test_op():
    return [(torch.randn(3),)]
""")
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the op's forward raised RuntimeError: kernel launch failed"])


KINKED = HEADER + """
class Float32ReLU(torch.autograd.Function):
    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.float32:
            raise TypeError("relu_kernel: expected float32")
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @classmethod
    def backward(cls, ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0).to(grad.dtype) * cls.factor

class Float32ReLUDoubled(Float32ReLU):
    factor = 2.0

@pytest.mark.autograd_op(op={op})
def test_relu():
    return [(torch.randint(-3, 4, (12,)).float(),)]  # integer values: several exactly at the kink
"""


def test_a_float32_only_relu_on_integer_samples_notes_the_kinks_instead_of_failing(pytester, run_pytest):
    pytester.makepyfile(test_ops=KINKED.format(op="Float32ReLU"))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*AutogradNote: gradcheck: at grad x* the one-sided differences differ (a kink) and "
                                 "the analytical value is one of them or between them: noted, not failed"])


def test_a_wrong_relu_gradient_away_from_the_kinks_still_fails_in_float32(pytester, run_pytest):
    pytester.makepyfile(test_ops=KINKED.format(op="Float32ReLUDoubled"))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of all outputs w.r.t. `x` does not match the numerical derivative in "
                                 "float32"])


SWISH = HEADER + """
@pytest.mark.autograd_op(op={op})
def test_swish():
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=generator).to(torch.bfloat16),) for _ in range(3)]
"""


def test_a_bfloat16_only_gradient_half_again_too_large_fails_gradcheck_without_a_reference(pytester, run_pytest):
    # It passed before: summing every output's rounding allowance made the tolerance as large as the gradient,
    # and the large steps bfloat16 needs hid the error in their own truncation error.
    pytester.makepyfile(test_ops=SWISH.format(op="SwishBfloat16OnlyGradTooLarge"))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative in bfloat16",
        "  check gradcheck, device cpu, dtype bfloat16, sample *",
        "*central differences in bfloat16 at steps *; the errors * converge to * as the step shrinks (Richardson "
        "extrapolation removes the steps' own truncation error), so it is the gradient's, not rounding's)",
    ])


def test_the_correct_bfloat16_only_kernel_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=SWISH.format(op="SwishBfloat16Only"))
    result = run_pytest("-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 10


def test_a_kernel_computing_in_float32_is_judged_in_float32_on_samples_the_user_gave_in_float32():
    # Float64 is the plugin's choice here: its finite differences would measure float32 rounding.
    import torch

    from pytest_autograd import run_checks
    from reference_ops.fused import FusedRMSNorm

    outcome, = run_checks(FusedRMSNorm, torch.randn(4, 8), torch.randn(8), checks=["gradcheck"])
    assert outcome.status == "passed", outcome.detail
    assert outcome.detail.startswith("gradcheck: the op computes (part of) its forward in float32 for float64 "
                                     "inputs"), outcome.detail


def test_a_kernel_computing_in_float32_for_float64_inputs_fails_gradcheck_saying_to_declare_float32():
    # Samples given in float64 ask for float64: checked there, its finite differences measure float32 rounding
    # ("expected 0 (numerical)"): the hint must name that, and the way to have it judged in float32, not send the
    # user after a wrong formula.
    import torch

    from pytest_autograd import run_checks
    from reference_ops.fused import FusedRMSNorm

    x, weight = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    outcome, = run_checks(FusedRMSNorm, x, weight, checks=["gradcheck"])
    assert outcome.status == "failed"
    assert "hint: the op computes in float32 for float64 inputs (its float64 outputs are all exactly float32 " \
           "numbers), so float64 finite differences measure float32 rounding" in outcome.detail
    declared, = run_checks(FusedRMSNorm, x, weight, checks=["gradcheck"], dtypes=(torch.float32,))
    assert declared.status == "passed", declared.detail


def _blind_plan(op, *args):
    import torch

    from pytest_autograd.checks._float32_blind import float32_blind_plan
    from pytest_autograd.checks.base import CheckContext
    from pytest_autograd.engine.case import Sample, build_case

    case = build_case({"op": op}, [Sample(*args)])
    with torch.random.fork_rng():
        return float32_blind_plan(CheckContext("gradcheck", case, "cpu", 0), case.samples[0])


def test_the_float32_probe_finds_a_forward_computing_partly_in_float32():
    import torch

    from reference_ops.fused import FusedRMSNorm
    from reference_ops.low_precision import GatedMixedPrecision, gated_samples

    assert _blind_plan(GatedMixedPrecision.apply, *gated_samples(torch.Generator().manual_seed(0))[0]).dtype \
        == torch.float32
    assert _blind_plan(FusedRMSNorm.apply, torch.randn(4, 8), torch.randn(8)).dtype == torch.float32
    silu_float32_times_b = lambda a, b: torch.nn.functional.silu(a.float()).to(a.dtype) * b  # noqa: E731
    assert _blind_plan(silu_float32_times_b, torch.randn(16, 64), torch.randn(16, 64)) is not None


def test_the_float32_probe_leaves_float64_arithmetic_to_float64_even_across_a_kink_or_with_random_numbers():
    import torch

    x = torch.randn(200, dtype=torch.float32)
    x[7] = 1.0 + 1e-5  # the resolved move crosses clamp's kink at 1 for this element only
    assert _blind_plan(lambda v: v.clamp(-1, 1) * torch.tanh(v), x) is None
    assert _blind_plan(lambda v: v * torch.rand_like(v), torch.randn(50)) is None
    assert _blind_plan(lambda v: torch.sin(3 * v) * v, torch.randn(10, 10)) is None


def test_the_float32_probe_is_not_asked_about_samples_the_user_gave_in_float64():
    import torch

    from reference_ops.fused import FusedRMSNorm

    assert _blind_plan(FusedRMSNorm.apply, torch.randn(4, 8, dtype=torch.float64),
                       torch.randn(8, dtype=torch.float64)) is None
