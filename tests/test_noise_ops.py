"""Ops that draw noise on every call: the derivative checks evaluate them with the same draws every time."""

import textwrap

import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.noise import GaussianNoise, MultiplicativeNoise, noise_samples
from reference_ops.random_ops import Dropout, dropout_samples


def test_correct_noise_ops_pass_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest, torch
        from reference_ops.noise import (GaussianNoise, GumbelSoftmax, MultiplicativeNoise, Reparameterized,
                                         gumbel_samples, noise_samples, reparameterized_samples)

        def seeded():
            return torch.Generator().manual_seed(0)

        @pytest.mark.autograd_op(op=GaussianNoise)
        def test_gaussian_noise():
            return noise_samples(seeded())

        @pytest.mark.autograd_op(op=MultiplicativeNoise)
        def test_multiplicative_noise():
            return noise_samples(seeded())

        @pytest.mark.autograd_op(op=Reparameterized)
        def test_reparameterized():
            return reparameterized_samples(seeded())

        @pytest.mark.autograd_op(op=GumbelSoftmax)
        def test_gumbel_softmax():
            return gumbel_samples(seeded())
    """))
    result = run_pytest("-rs")
    assert result.ret == 0, result.stdout.str()


def test_a_backward_that_draws_the_noise_again_fails_gradcheck_saying_to_save_forwards_draws(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest, torch
        from reference_ops.noise import MultiplicativeNoiseRedrawsInBackward, noise_samples

        @pytest.mark.autograd_op(op=MultiplicativeNoiseRedrawsInBackward)
        def test_noise():
            return noise_samples(torch.Generator().manual_seed(0))
    """))
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient of output w.r.t. `x` does not match the numerical derivative",
        "*check gradcheck, device cpu, dtype float64, sample 0",
        "*hint: backward draws random numbers from torch's global generator: every evaluation here started it from "
        "one seed*Save what forward drew (ctx.save_for_backward(noise)) and use it in backward*",
    ])


def test_a_reparameterized_sample_whose_backward_redraws_fails_gradcheck_naming_log_sigma(pytester, run_pytest):
    pytester.makepyfile(test_ops=textwrap.dedent("""
        import pytest, torch
        from reference_ops.noise import ReparameterizedRedrawsInBackward, reparameterized_samples

        @pytest.mark.autograd_op(op=ReparameterizedRedrawsInBackward)
        def test_reparameterized():
            return reparameterized_samples(torch.Generator().manual_seed(0))
    """))
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*gradient of output w.r.t. `log_sigma` does not match the numerical derivative",
        "*hint: backward draws random numbers*",
    ])


def test_a_multiplicative_noise_op_passes_gradgradcheck_on_a_large_sample_judged_by_probes():
    x = torch.randn(200, 300, generator=torch.Generator().manual_seed(1))
    outcomes = run_checks(MultiplicativeNoise, x, checks=["gradcheck", "gradgradcheck"])
    assert [o.status for o in outcomes] == ["passed", "passed"], [o.detail for o in outcomes]


def test_dropouts_derivatives_are_judged_with_one_mask_so_no_kink_is_noted():
    (outcome,) = run_checks(Dropout, samples=dropout_samples(), checks=["gradcheck"])
    assert outcome.status == "passed"
    assert "kink" not in outcome.detail


def test_a_derivative_failure_of_an_op_drawing_only_in_forward_gets_the_usual_hint():
    class NoiseTimesTwoBackwardForgetsTheTwo(GaussianNoise):
        @staticmethod
        def forward(ctx, x):
            return 2 * x + torch.randn_like(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    (outcome,) = run_checks(NoiseTimesTwoBackwardForgetsTheTwo, samples=noise_samples(), checks=["gradcheck"])
    assert outcome.status == "failed"
    assert "backward draws random numbers" not in outcome.detail


class DropoutOwnGenerator(torch.autograd.Function):
    """Dropout whose mask comes from a torch.Generator of its own, saved for backward: correct when called plainly."""

    generator = torch.Generator().manual_seed(0)

    @staticmethod
    def forward(ctx, x):
        keep = (torch.rand(x.shape, generator=DropoutOwnGenerator.generator) >= 0.3).to(x.dtype) / 0.7
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep


class NoiseFromNumpy(torch.autograd.Function):
    """Multiplicative noise drawn from numpy's global generator, saved for backward."""

    @staticmethod
    def forward(ctx, x):
        import numpy

        scale = 1 + 0.1 * torch.from_numpy(numpy.random.randn(*x.shape)).to(x.dtype)
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale


def test_ops_drawing_from_a_generator_of_their_own_or_numpys_pass_both_derivative_checks():
    for op in (DropoutOwnGenerator, NoiseFromNumpy):
        for x in (torch.randn(6, 8), torch.randn(200, 300)):  # the full Jacobian, and probes
            outcomes = run_checks(op, x, checks=["gradcheck", "gradgradcheck"])
            assert [o.status for o in outcomes] == ["passed", "passed"], (op.__name__, [o.detail for o in outcomes])
