"""gradcheck and gradgradcheck of one run share their float64 work (checks/_first_order), and judge the same."""

import pytest
import torch

from pytest_autograd import Sample, run_checks
from reference_ops import LinearFunction
from reference_ops.buggy import PLANTED_BUGS, LinearWeightGradTransposed
from reference_ops.functions import EXAMPLES
from reference_ops.memory_saving import SwiGLUSavesMemory, SwiGLUSavesMemoryKernelStyle
from reference_ops.scale import FAMILIES, Gelu, LayerNormAffineSavesRstd

PAIR = ["gradcheck", "gradgradcheck"]


def _counting(op):
    """A subclass of the Function ``op`` counting its forward calls."""
    calls = {"forward": 0}

    class Counted(op):
        @staticmethod
        def forward(ctx, *args):
            calls["forward"] += 1
            return op.forward(ctx, *args)

    return Counted, calls


def _large_sample(family, elements=1 << 13):
    return [Sample(*args) for args in FAMILIES[family].samples(elements, torch.Generator().manual_seed(0))]


def test_gradgradcheck_runs_no_forward_of_its_own_after_gradcheck_in_the_same_run():
    op, calls = _counting(Gelu)
    samples = _large_sample("gelu")
    run_checks(op, samples=samples, checks=["gradcheck"])
    alone = calls["forward"]
    calls["forward"] = 0
    outcomes = run_checks(op, samples=samples, checks=PAIR)
    assert [o.status for o in outcomes] == ["passed", "passed"], [o.detail for o in outcomes]
    assert calls["forward"] == alone


def test_gradcheck_runs_the_op_once_at_the_sample_and_twice_per_probe_with_no_separate_float64_trial():
    # Its float64 forward and backward at the sample tell that the op runs in float64: no trial run before it.
    op, calls = _counting(Gelu)
    outcome = run_checks(op, samples=_large_sample("gelu"), checks=["gradcheck"])[0]
    assert outcome.status == "passed", outcome.detail
    assert calls["forward"] == 1 + 2 * 3


def test_gradgradcheck_says_the_same_with_or_without_gradcheck_before_it():
    samples = _large_sample("layer_norm")
    alone = run_checks(LayerNormAffineSavesRstd, samples=samples, checks=["gradgradcheck"])[0]
    after = run_checks(LayerNormAffineSavesRstd, samples=samples, checks=PAIR)
    assert after[0].status == "passed", after[0].detail
    assert alone.status == after[1].status == "failed"
    assert after[1].detail == alone.detail


def test_gradcheck_names_the_wrong_weight_gradient_with_or_without_gradgradcheck_after_it():
    generator = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(96, 64, generator=generator), torch.randn(48, 64, generator=generator),
               torch.randn(48, generator=generator))
    for checks in (["gradcheck"], PAIR):
        found = run_checks(LinearWeightGradTransposed, x, w, b, checks=checks)[0]
        assert found.status == "failed"
        assert found.detail.startswith("gradient of all outputs w.r.t. `weight` does not match the numerical "
                                       "derivative"), found.detail
    right = run_checks(LinearFunction, x, w, b, checks=PAIR)
    assert [o.status for o in right] == ["passed", "passed"], [o.detail for o in right]


@pytest.mark.parametrize("op", [SwiGLUSavesMemory, SwiGLUSavesMemoryKernelStyle])
def test_a_memory_saving_backward_spoils_no_gradient_gradgradcheck_takes_from_gradcheck(op):
    # Its backward writes the gradients into the buffers forward saved, which the first gradients are: the
    # pair judges the gradients as gradcheck alone does, and gradgradcheck does not differentiate spoilt ones.
    generator = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randn(64, 48, generator=generator), torch.randn(64, 48, generator=generator))]
    alone = {o.check: o for o in run_checks(op, samples=samples, checks=["gradcheck"], mutates=("a", "b"))}
    together = {o.check: o for o in run_checks(op, samples=samples, checks=PAIR, mutates=("a", "b"))}
    assert alone["gradcheck"].status == together["gradcheck"].status == "passed", together["gradcheck"].detail
    separately = run_checks(op, samples=samples, checks=["gradgradcheck"], mutates=("a", "b"))[0]
    assert together["gradgradcheck"].status == separately.status
    assert together["gradgradcheck"].detail.splitlines()[:1] == separately.detail.splitlines()[:1]


def test_nothing_is_kept_for_gradgradcheck_once_a_run_is_over():
    samples = _large_sample("gelu")
    from pytest_autograd.engine import api

    kept = []
    original = api.build_case

    def remembering(*args, **kwargs):
        case = original(*args, **kwargs)
        kept.append(case)
        return case

    api.build_case = remembering
    try:
        run_checks(Gelu, samples=samples, checks=PAIR)
    finally:
        api.build_case = original
    assert kept and not kept[0].__dict__.get("_first_orders")


@pytest.mark.parametrize("name", sorted(PLANTED_BUGS))
@pytest.mark.parametrize("which", ["bug", "twin"])
def test_each_derivative_check_says_the_same_alone_and_beside_the_other(name, which):
    # e.g. a backward writing into grad_output cannot take it as a leaf that requires grad (gradgradcheck's
    # cotangents): gradcheck must not take that for an op refusing float64.
    bug, twin, example = PLANTED_BUGS[name]
    op = bug if which == "bug" else twin
    samples = [Sample(*args) for args in EXAMPLES[example].samples()]
    together = run_checks(op, samples=samples, checks=PAIR)
    random_values = "Nondeterministic" in op.__name__  # its values differ from run to run: so may its report
    for outcome in together:
        alone = run_checks(op, samples=samples, checks=[outcome.check])[0]
        assert outcome.status == alone.status, (outcome.detail, alone.detail)
        if not random_values:
            assert outcome.detail.splitlines()[:2] == alone.detail.splitlines()[:2]
