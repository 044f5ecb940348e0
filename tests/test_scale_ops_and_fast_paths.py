"""The scale benchmark's ops and the shortcuts large samples take: correct ops pass, planted ones fail, and the
cheap paths agree with the full ones they stand in for."""

import math

import pytest
import torch

from pytest_autograd import Sample, run_checks
from pytest_autograd.checks._agreement import agree
from pytest_autograd.engine.draws import (
    LARGE_DRAW,
    REPEAT_AFTER,
    normal,
    normal_like,
    repeating_normal_like,
    uniform,
)
from pytest_autograd.results.compare import compare_tensors, unravel
from reference_ops.buggy import PLANTED_BUGS
from reference_ops.functions import EXAMPLES
from reference_ops.scale import (
    FAMILIES,
    AttentionSavesProbabilities,
    LayerNormAffineSavesRstd,
    attention_reference,
    layer_norm_reference,
)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_scale_family_passes_every_default_check_at_a_small_size(family):
    op, reference, samples = FAMILIES[family]
    generator = torch.Generator().manual_seed(0)
    outcomes = run_checks(op, samples=[Sample(*args) for args in samples(256, generator)], reference=reference)
    failed = [(o.check, o.detail) for o in outcomes if o.status == "failed"]
    assert not failed, failed


@pytest.mark.parametrize(("twin", "reference", "family"), [
    (LayerNormAffineSavesRstd, layer_norm_reference, "layer_norm"),
    (AttentionSavesProbabilities, attention_reference, "attention"),
])
def test_a_backward_using_intermediates_saved_in_forward_fails_gradgradcheck_only(twin, reference, family):
    generator = torch.Generator().manual_seed(0)
    samples = [Sample(*args) for args in FAMILIES[family].samples(256, generator)]
    outcomes = {o.check: o for o in run_checks(twin, samples=samples, reference=reference,
                                               checks=["gradcheck", "gradgradcheck", "reference"])}
    assert outcomes["gradcheck"].status == "passed", outcomes["gradcheck"].detail
    assert outcomes["reference"].status == "passed", outcomes["reference"].detail
    assert outcomes["gradgradcheck"].status == "failed"
    assert outcomes["gradgradcheck"].detail.startswith(("backward is not differentiable w.r.t. `",
                                                        "second derivative of all outputs w.r.t. `")), \
        outcomes["gradgradcheck"].detail


def _mismatches(expected, got, atol=1e-7, rtol=1e-5):
    return compare_tensors(expected, got, atol=atol, rtol=rtol)


@pytest.mark.parametrize("case", ["equal", "close", "one_element_off", "nan_in_got", "inf_in_expected", "shape"])
def test_the_cheap_agreement_test_never_says_agree_where_the_full_comparison_finds_a_mismatch(case):
    expected = torch.randn(64, 33, dtype=torch.float64)
    got = expected.clone()
    if case == "close":
        got = expected * (1 + 1e-7)
    elif case == "one_element_off":
        got[5, 7] += 1e-3
    elif case == "nan_in_got":
        got[0, 0] = math.nan
    elif case == "inf_in_expected":
        expected[1, 1] = math.inf
    elif case == "shape":
        got = got[:-1]
    cheap_agrees = agree(expected, got, 1e-7, 1e-5)
    assert cheap_agrees is (case in ("equal", "close"))
    if case != "shape":
        full_mismatch = bool(_mismatches(expected, got))
        assert not (cheap_agrees and full_mismatch)
        if case in ("equal", "close", "one_element_off", "nan_in_got"):
            assert full_mismatch is (case in ("one_element_off", "nan_in_got"))


def test_large_draws_are_float32_values_widened_and_small_ones_keep_their_float64_values():
    small, large = (LARGE_DRAW - 1,), (LARGE_DRAW,)
    assert torch.equal(normal(small, torch.Generator().manual_seed(3)),
                       torch.randn(small, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    drawn = normal(large, torch.Generator().manual_seed(3))
    assert drawn.dtype == torch.float64 and torch.equal(drawn, drawn.float().double())
    assert 0.9 < drawn.std().item() < 1.1
    values = uniform(large, torch.Generator().manual_seed(3))
    assert values.min().item() >= 0.0 and values.max().item() < 1.0
    assert normal_like(large, torch.Generator(), "cpu", torch.float32).dtype == torch.float32


def test_repeating_draws_repeat_one_varied_block_and_only_past_its_length():
    def seeded():
        return torch.Generator().manual_seed(3)

    at_most = (REPEAT_AFTER,)
    assert torch.equal(repeating_normal_like(at_most, seeded(), "cpu", torch.float32),
                       normal_like(at_most, seeded(), "cpu", torch.float32))
    drawn = repeating_normal_like((3, REPEAT_AFTER), seeded(), "cpu", torch.float64)
    assert drawn.shape == (3, REPEAT_AFTER) and drawn.dtype == torch.float64
    flat = drawn.reshape(-1)
    block = flat[:REPEAT_AFTER]
    assert torch.equal(flat[REPEAT_AFTER:2 * REPEAT_AFTER], block)
    assert torch.unique(block).numel() > 0.99 * REPEAT_AFTER
    assert 0.45 < (block > 0).double().mean().item() < 0.55


@pytest.mark.parametrize("shape", [(), (7,), (3, 4, 5), (1, 6, 1, 2)])
def test_unravel_gives_the_index_torch_gives(shape):
    for flat in range(math.prod(shape)):
        assert unravel(flat, shape) == tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _large_linear(generator):
    return [Sample(torch.randn(400, 256, generator=generator), torch.randn(256, 256, generator=generator),
                   torch.randn(256, generator=generator))]


def _large_elementwise(generator):
    return [Sample(torch.randn(300, 300, generator=generator))]


# Checks whose cotangents repeat past REPEAT_AFTER elements, each on a planted bug with outputs longer than that.
LARGE_HYGIENE_BUGS = {
    "ScaleMutatesGradOutput": ("mutation", _large_elementwise, "backward modified its incoming gradient"),
    "LinearContiguousAssumption": ("noncontiguous", _large_linear, "differs from the contiguous run"),
    "ReLUNondeterministic": ("determinism", _large_elementwise, "two runs on the same inputs differ"),
    "LinearSavesCtxAttributes": ("leak", _large_linear, "as plain ctx attributes"),
}


@pytest.mark.parametrize("name", sorted(LARGE_HYGIENE_BUGS))
def test_checks_with_repeating_cotangents_catch_their_bug_past_the_repeat_and_pass_its_twin(name):
    check, samples, words = LARGE_HYGIENE_BUGS[name]
    bug = PLANTED_BUGS[name]
    reference = EXAMPLES[bug.example].reference
    large = samples(torch.Generator().manual_seed(0))
    assert large[0].args[0].shape[0] * 256 > REPEAT_AFTER
    [caught] = run_checks(bug.function, samples=large, checks=[check], reference=reference)
    assert caught.status == "failed" and words in caught.detail
    [twin] = run_checks(bug.twin, samples=large, checks=[check], reference=reference)
    assert twin.status == "passed", twin.detail


def _planted(case):
    numerical = torch.randn(40, 25, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    analytical = numerical * (1 + 1e-9)
    if case == "one_element_off":
        analytical[3, 4] += 1e-2
    elif case == "nan_in_analytical":
        analytical[7, 1] = math.nan
    elif case == "nan_in_numerical":
        numerical[2, 2] = math.nan
    elif case == "zero_tolerance":
        numerical[0, 0], analytical[0, 0] = 0.0, 1e-300
    return numerical, analytical


@pytest.mark.parametrize("case", ["close", "one_element_off", "nan_in_analytical", "nan_in_numerical",
                                  "zero_tolerance"])
def test_the_derivative_comparison_names_the_same_element_with_or_without_its_shortcut(case):
    from pytest_autograd.checks import _numerical

    numerical, analytical = _planted(case)
    atol = 0.0 if case == "zero_tolerance" else 1e-5
    shortcut = _numerical.worst_of(numerical, analytical, atol, 1e-3)
    full = _numerical.worst_of(numerical, analytical, atol, 1e-3, excluded=torch.zeros_like(numerical, dtype=bool))
    assert (shortcut is None) is (full is None)
    assert shortcut is None or shortcut[0] == full[0]
    assert (shortcut is None) is (case == "close")
    if case == "nan_in_numerical":  # it fails, and hides no other element (callers leave out a step's excursion)
        assert shortcut[0] == (2, 2)


@pytest.mark.parametrize("case", ["equal", "one_element_off", "nan_in_both", "nan_in_one"])
def test_two_runs_differ_exactly_where_they_differ_with_or_without_the_bitwise_shortcut(case):
    from pytest_autograd.checks._hygiene import max_difference

    first = torch.randn(30, 30, generator=torch.Generator().manual_seed(2))
    second = first.clone()
    if case == "one_element_off":
        second[4, 5] = torch.nextafter(second[4, 5], torch.tensor(math.inf))
    elif case == "nan_in_both":
        first[1, 1] = second[1, 1] = math.nan
    elif case == "nan_in_one":
        second[1, 1] = math.nan
    largest, index, count = max_difference(first, second)
    assert count == {"equal": 0, "one_element_off": 1, "nan_in_both": 0, "nan_in_one": 1}[case]
    assert index == {"one_element_off": (4, 5), "nan_in_one": (1, 1)}.get(case)
    assert (largest == 0.0) is (case in ("equal", "nan_in_both"))
