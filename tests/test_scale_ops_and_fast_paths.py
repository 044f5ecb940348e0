"""The scale benchmark's ops and the shortcuts large samples take: correct ops pass, planted ones fail, and the
cheap paths agree with the full ones they stand in for."""

import math

import pytest
import torch

from pytest_autograd import Sample, run_checks
from pytest_autograd.checks._agreement import agree
from pytest_autograd.engine.draws import LARGE_DRAW, normal, normal_like, uniform
from pytest_autograd.results.compare import compare_tensors
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
