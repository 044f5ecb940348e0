"""extreme: no inf/NaN at large and tiny magnitudes where the reference (or float64) is finite."""

import math

import pytest
import torch

import pytest_autograd.checks.extreme  # noqa: F401
import reference_ops.transforms  # noqa: F401
from pytest_autograd.checks.extreme import magnitudes

OPS = """
import pytest
import torch
from reference_ops import Cube
from reference_ops.transforms import NaiveSoftmax, StableSoftmax, softmax_reference


def naive_normalize(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


@pytest.mark.autograd_op(op={op}{marker})
def test_op():
    return [(torch.randn(3, 5),), (torch.randn(7),)]
"""


def run(pytester, op, marker=""):
    pytester.makepyfile(test_ops=OPS.format(op=op, marker=marker))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=extreme", "-rs")


def test_a_naive_softmax_overflows_in_float32_and_fails(pytester):
    result = run(pytester, "NaiveSoftmax", ", reference=softmax_reference")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output is NaN in float32 for inputs scaled to max |x| = 177.446, where the reference in float64 is finite",
        "*check extreme, device cpu, dtype float32, sample 0",
        "*worst element: output[[]*]: the reference in float64 gives *, the op nan",
        "*elements are inf/NaN where the reference in float64 is finite",
        "*magnitude large: exp overflows*",
        "*hint: an intermediate overflows float32*subtract the max before exp*",
    ])


def test_without_a_reference_the_float64_op_is_the_judge(pytester):
    result = run(pytester, "NaiveSoftmax")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*output is NaN in float32 *, where the op in float64 is finite"])


def test_a_max_subtracted_softmax_passes_in_every_dtype(pytester):
    marker = ", reference=softmax_reference, dtypes=['float32', 'float16', 'bfloat16']"
    run(pytester, "StableSoftmax", marker).assert_outcomes(passed=1)


def test_overflow_the_dtype_cannot_avoid_is_not_a_failure(pytester):
    # x**3 of float16 inputs near 8..22 exceeds 65504: float64 is finite, but does not fit float16
    run(pytester, "Cube", ", dtypes=['float64', 'float32', 'float16']").assert_outcomes(passed=1)


def test_a_norm_whose_squares_underflow_fails_at_tiny_magnitude(pytester):
    result = run(pytester, "naive_normalize")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output is inf in float32 for inputs scaled to max |x| = *e-23, where the op in float64 is finite",
        "*magnitude tiny: squares underflow to 0*",
        "*hint: an intermediate underflows to 0*",
    ])


def test_magnitudes_reach_the_edges_of_each_dtype():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        info = torch.finfo(dtype)
        values = dict(magnitudes(dtype))
        tiny = values["tiny: squares underflow to 0"]
        assert torch.tensor(tiny, dtype=dtype) > 0 and torch.tensor(tiny, dtype=dtype) ** 2 == 0
        assert math.exp(values["large: exp overflows"]) > info.max
        huge = torch.tensor(values["huge: products of four inputs still fit"], dtype=dtype)
        assert torch.isfinite(huge**4)


def test_a_reference_that_raises_is_blamed_instead_of_the_op(pytester):
    result = run(pytester, "Cube", marker=", reference=lambda x, scale: x ** 3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=lambda at test_ops.py:* raised TypeError in its forward: *missing 1 required positional argument: 'scale'",
    ])


EDGES = """
import pytest
import torch
from reference_ops.edges import *
from reference_ops.edges import EDGE_OPS, row_softplus_reference


def narrow(x):
    if not bool(((x.abs() >= 0.05) & (x.abs() <= 3)).all()):
        raise ValueError("defined for 0.05 <= |x| <= 3 only")
    return x * 2


@pytest.mark.autograd_op(op={op}{marker})
def test_op():
    generator = torch.Generator().manual_seed(0)
    return EDGE_OPS[{samples!r}].samples(generator)
"""


def run_edges(pytester, op, samples, marker="", *args):
    pytester.makepyfile(test_ops=EDGES.format(op=op, marker=marker, samples=samples))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                        "--autograd-checks=extreme", "-rs", *args)


def test_a_backward_that_shortcuts_to_zero_past_4_fails_at_a_moderate_magnitude(pytester):
    result = run_edges(pytester, "SoftplusShortcut", "softplus", ", reference=torch.nn.functional.softplus")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` in float32 is off from the reference in float64 by * for inputs scaled to max |x| = 6, "
        "more than its error budget *",
        "*argument: x",
        "*worst element: grad x[[]*]: the reference in float64 gives *, the op 0",
        "*error * (max abs error / max |float64 value|, *) > budget *: the float32 tolerance sqrt(eps) = *",
        "*magnitude moderate: saturating tails begin*",
        "*hint: backward is wrong at large |x| although it stays finite: a shortcut that returns 0*",
    ])


def test_the_shortcut_hint_says_the_op_is_right_on_the_unscaled_samples(pytester):
    result = run_edges(pytester, "SoftplusShortcut", "softplus", ", reference=torch.nn.functional.softplus")
    result.stdout.fnmatch_lines(["*hint: backward is wrong at large |x| although it stays finite: a shortcut that "
                                 "returns 0 past a threshold (the op's gradient is 0 where the derivative is not), and "
                                 "right on the samples as they are*"])


def test_a_backward_wrong_everywhere_is_not_blamed_on_large_inputs(pytester):
    pytester.makepyfile(test_ops="""
import pytest, torch

class SoftplusDoubledGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * grad * torch.sigmoid(x)  # BUG at every magnitude

@pytest.mark.autograd_op(op=SoftplusDoubledGradient, reference=torch.nn.functional.softplus)
def test_softplus():
    return [(torch.randn(3, 5),)]
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                          "--autograd-checks=extreme", "--autograd-shrink=0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hint: backward is wrong on the samples as they are too, not only at large |x|: the "
                                 "formula itself is off, not a large-|x| branch*"])
    assert "shortcut" not in result.stdout.str() and "saturation branch" not in result.stdout.str()


def test_the_correct_softplus_passes_at_every_magnitude_in_every_dtype(pytester):
    marker = ", reference=torch.nn.functional.softplus, dtypes=['float32', 'float16', 'bfloat16']"
    run_edges(pytester, "Softplus", "softplus", marker).assert_outcomes(passed=1)


def test_constant_row_indices_stored_as_floats_are_never_rescaled(pytester):
    marker = ", reference=row_softplus_reference, constants=('rows',)"
    run_edges(pytester, "RowSoftplus", "row_softplus", marker).assert_outcomes(passed=1)


def test_the_shortcut_is_still_caught_beside_constant_row_indices(pytester):
    marker = ", reference=row_softplus_reference, constants=('rows',)"
    result = run_edges(pytester, "RowSoftplusShortcut", "row_softplus", marker)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `x` in float32 is off from the reference in float64 by *"])


def test_only_differentiated_arguments_are_scaled():
    from pytest_autograd.engine.case import Sample
    from pytest_autograd.checks._transforms import cast_sample as scale_sample

    x, rows, index = torch.randn(3, 4), torch.tensor([2.0, 0.0]), torch.tensor([1, 0])
    scaled = scale_sample(Sample(x, rows, index), torch.float32, slots={0}, magnitude=1e9)
    assert float(scaled.args[0].abs().max()) == pytest.approx(1e9)
    assert torch.equal(scaled.args[1], rows) and torch.equal(scaled.args[2], index)


def test_magnitudes_where_the_reference_raises_are_outside_the_domain_and_noted(pytester):
    result = run_edges(pytester, "TabulatedTanh", "tabulated_tanh", ", reference=tabulated_tanh_reference", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*autograd notes*",
        "extreme: outside the op's domain (the reference in float64 raises ValueError (the table covers |x| <= 100 "
        "only), and the op raises too) at max |x| = 177.446, 2.14748e+09",
    ])


def test_an_op_that_raises_where_the_reference_runs_is_still_blamed(pytester):
    result = run_edges(pytester, "TabulatedTanh", "tabulated_tanh", ", reference=torch.tanh")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's forward raised ValueError for inputs scaled to max |x| = 177.446, where the reference in float64 "
        "runs: the table covers |x| <= 100 only",
    ])


def test_when_no_magnitude_is_in_the_domain_the_item_is_skipped_with_the_reason(pytester):
    result = run_edges(pytester, "narrow", "tanh")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "*no magnitude could be judged: outside the op's domain (the op in float64 raises ValueError (defined for "
        "0.05 <= |x| <= 3 only), and the op raises too) at max |x| = *",
    ])


def test_a_solver_that_never_returns_at_a_huge_magnitude_is_stopped_and_noted(pytester):
    # euler_decay takes t / step steps: at a time span of 2e9 it would run for hours
    result = run_edges(pytester, "euler_decay", "euler_decay", ", reference=euler_decay_reference", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        # 2e9 / 0.25 steps; on a busy machine the stop may come one magnitude earlier (177 / 0.25 steps). The limit
        # is 2 s or 50 x the first magnitude's time, whichever is longer (2.4 s on a loaded 16-core machine)
        "extreme: stopped after * s (the op is far slower there than at smaller magnitudes, e.g. a solver that "
        "does not converge) at max |x| = *",
    ])


def test_an_op_that_raises_on_its_sample_as_given_is_not_blamed_on_a_magnitude():
    import torch

    from pytest_autograd import run_checks
    from reference_ops.low_precision import SwishBfloat16Only, swish_reference

    outcome, = run_checks(SwishBfloat16Only, torch.randn(4, 8), reference=swish_reference, checks=["extreme"])
    assert outcome.status == "failed"
    assert outcome.detail.startswith("the op's forward raised RuntimeError on the sample as given, in float32, at "
                                     "every magnitude: swish_kernel: only bfloat16 is supported")
    assert "scaled to max |x|" not in outcome.detail


def test_a_slow_truth_does_not_stop_the_magnitudes_after_the_tiny_one_which_runs_without_it(monkeypatch):
    # The tiny magnitude judges finiteness only and runs no truth when the op's values are finite: its time must
    # not set the pace for the magnitudes that run the (slower) truth, or they stop for time and the op passes.
    import time

    import torch

    from pytest_autograd import run_checks
    from pytest_autograd.checks import extreme

    monkeypatch.setattr(extreme, "MAGNITUDE_SECONDS", 0.2)

    def square_dropping_the_tail(x):  # BUG: 0 past |x| > 1000
        return torch.where(x.abs() > 1000, torch.zeros_like(x), x * x)

    def slow_square(x):
        time.sleep(0.25)
        return x * x

    samples = [(torch.randn(4, 5, generator=torch.Generator().manual_seed(3)),)]
    outcome = run_checks(square_dropping_the_tail, reference=slow_square, samples=samples, checks=["extreme"])[0]
    assert outcome.status == "failed", outcome.detail
    assert "for inputs scaled to max |x|" in outcome.detail


def _extreme(op, samples, **options):
    from pytest_autograd.engine.api import run_checks

    (outcome,) = run_checks(op, samples=samples, checks=["extreme"], **options)
    return outcome


def test_a_magnitude_the_sample_already_reaches_is_not_rerun_and_the_note_says_so():
    from reference_ops.edges import Softplus

    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))  # largest |x| about 4.5: 6 is reached
    outcome = _extreme(Softplus.apply, [(x,)], reference=torch.nn.functional.softplus)
    assert outcome.status == "passed", outcome.detail
    assert "not run where the sample is already there" in outcome.detail
    assert "at max |x| = 6" in outcome.detail and "20" not in outcome.detail


def test_a_small_sample_is_still_rescaled_to_every_magnitude():
    from reference_ops.edges import Softplus

    x = torch.rand(3, 5, generator=torch.Generator().manual_seed(0))  # largest |x| below 1: nothing reached
    outcome = _extreme(Softplus.apply, [(x,)], reference=torch.nn.functional.softplus)
    assert outcome.status == "passed", outcome.detail
    assert "already there" not in outcome.detail


def test_a_shortcut_is_caught_at_a_larger_magnitude_when_the_sample_already_reaches_the_moderate_one():
    from reference_ops.edges import SoftplusShortcut

    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))  # shortcut past 4: a few elements here
    outcome = _extreme(SoftplusShortcut.apply, [(x,)], reference=torch.nn.functional.softplus)
    assert outcome.status == "failed"
    assert "gradient w.r.t. `x` in float32 is off from the reference in float64" in outcome.detail
    assert "for inputs scaled to max |x| = 20," in outcome.detail


def test_a_dtype_the_sample_is_not_in_is_rescaled_even_where_the_sample_reaches_the_magnitude():
    from reference_ops.edges import Softplus

    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))
    outcome = _extreme(Softplus.apply, [(x.double(),)], reference=torch.nn.functional.softplus,
                       dtypes=(torch.float64, torch.float32))
    assert outcome.status == "passed", outcome.detail
    assert "already there" not in outcome.detail


def test_at_the_tiny_magnitude_a_two_input_op_has_each_input_scaled_alone_and_an_underflowing_norm_fails():
    def cosine_without_eps(a, b):
        return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))

    outcome = _extreme(cosine_without_eps, [(torch.randn(4, 8), torch.randn(4, 8))])
    assert outcome.status == "failed"
    assert "in float32 for inputs scaled to max |x| = " in outcome.detail
    assert "magnitude tiny: squares underflow to 0: `a` scaled so its largest |element| is" in outcome.detail
    assert "the other inputs as given" in outcome.detail


# ---------------------------------------------------------------------------
# A wrong value fails only against a yardstick of what the dtype can reach there
# ---------------------------------------------------------------------------

FLASH = """
import pytest, torch
from reference_ops.flash_attention import *

@pytest.mark.autograd_op(op={op}{marker})
def test_attention():
    return attention_samples(torch.Generator().manual_seed(1))
"""


def run_flash(pytester, op, marker=""):
    pytester.makepyfile(test_ops=FLASH.format(op=op, marker=marker))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                        "--autograd-checks=extreme", "-rs")


@pytest.mark.parametrize("marker", ["", ", reference=attention_reference"])
def test_flash_attention_2_s_backward_passes_at_every_magnitude_with_or_without_a_reference(pytester, marker):
    # P = exp(S - lse) and delta = rowsum(dO * O) cancel where a row's softmax saturates: float32 loses digits there
    # in any implementation of the algorithm, and the op's own rounding noise says so
    result = run_flash(pytester, "FlashAttention", marker)
    result.assert_outcomes(passed=1)


def test_flash_attention_recomputing_probabilities_from_an_unshifted_exp_still_fails_without_a_reference(pytester):
    result = run_flash(pytester, "FlashAttentionUnshiftedExp")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `*` is NaN in float32 for inputs scaled to max |x| = 20, where the op in float64 is finite",
        "*hint: an intermediate overflows float32*subtract the max before exp*",
    ])


SOFTPLUS_IN_BFLOAT16 = """
import pytest, torch
import torch.nn.functional as F


class SoftplusInBfloat16(torch.autograd.Function):
    # a mixed-precision kernel: float32 inputs are computed in bfloat16, float64 ones in float64
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.softplus(x.bfloat16() if x.dtype == torch.float32 else x).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


@pytest.mark.autograd_op(op=SoftplusInBfloat16{marker})
def test_softplus():
    return [(torch.rand(3, 5, generator=torch.Generator().manual_seed(0)),)]
"""


def run_softplus_in_bfloat16(pytester, marker=""):
    pytester.makepyfile(test_ops=SOFTPLUS_IN_BFLOAT16.format(marker=marker))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                        "--autograd-checks=extreme", "-rs")


def test_without_a_reference_an_error_past_the_ops_own_rounding_noise_is_noted_with_how_to_judge_it(pytester):
    result = run_softplus_in_bfloat16(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*AutogradNote: sample 0: extreme: not judged at max |x| = 6 in float32: output is off from the op in float64 "
        "by *, over its budget * (output[[]*[]]: * against *); without reference= the truth is the op itself in "
        "float64, which says what its formula gives, not what float32 can reach at this magnitude: there is no "
        "yardstick; to judge it, pass reference= (any implementation of the same maths that runs in float32, torch's "
        "own where there is one): its own float32 error there is the yardstick",
    ])


def test_with_a_reference_running_in_the_dtype_the_same_error_fails_naming_its_yardstick(pytester):
    result = run_softplus_in_bfloat16(pytester, ", reference=F.softplus")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output in float32 is off from the reference in float64 by * for inputs scaled to max |x| = 6, more than its "
        "error budget *",
        "*or 16 x how far the op's own result moves, when the inputs move by one float32 rounding, whichever is "
        "largest",
        "*failed on evidence that the op is meant to work there: reference= runs in float32 there, and its own error "
        "measures what float32 can reach",
    ])


def test_flash_attention_2_passes_every_default_check_and_its_unshifted_exp_twin_fails_extreme_alone(pytester):
    pytester.makepyfile(test_ops="""
        import pytest, torch
        from reference_ops.flash_attention import *

        @pytest.mark.autograd_op(op=FlashAttention, reference=attention_reference)
        def test_attention():
            return attention_samples(torch.Generator().manual_seed(0))

        @pytest.mark.autograd_op(op=FlashAttention)
        def test_attention_in_a_model_scan():
            return attention_samples(torch.Generator().manual_seed(1))

        @pytest.mark.autograd_op(op=FlashAttentionUnshiftedExp, reference=attention_reference)
        def test_unshifted_exp():
            return attention_samples(torch.Generator().manual_seed(0))
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-rf")
    failed = [line.split(" ")[1] for line in result.outlines if line.startswith("FAILED")]
    assert failed == ["test_ops.py::test_unshifted_exp[extreme-cpu]"], result.stdout.str()
