"""Complex arguments and outputs are differentiated (as real and imaginary parts), never silently skipped."""

import torch

from pytest_autograd.engine.api import run_checks

OPS = """
import pytest
import torch
from reference_ops.complex_ops import ComplexMul, ComplexMulMissingConj, complex_mul_samples


@pytest.mark.autograd_op(op=ComplexMul, reference=torch.mul)
def test_complex_mul():
    return complex_mul_samples(torch.Generator().manual_seed(0))


@pytest.mark.autograd_op(op=ComplexMulMissingConj, reference=torch.mul)
def test_complex_mul_missing_conj():
    return complex_mul_samples(torch.Generator().manual_seed(0))
"""


def test_a_missing_conjugation_in_a_complex_backward_fails_and_the_correct_twin_passes_every_check(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("-v", "-rfs")
    failed = [line for line in result.stdout.lines if line.startswith("FAILED")]
    assert failed and all("test_complex_mul_missing_conj[" in line for line in failed), result.stdout.str()
    result.stdout.fnmatch_lines_random([
        "*test_complex_mul[[]gradcheck-cpu[]] PASSED*",
        "*test_complex_mul[[]gradgradcheck-cpu[]] PASSED*",
        "*test_complex_mul[[]reference-cpu[]] PASSED*",
        "*test_complex_mul[[]requires_grad-cpu[]] PASSED*",
        "*test_complex_mul_missing_conj[[]gradcheck-cpu[]] FAILED*",
        "gradient of output w.r.t. `?` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
    ])


def test_complex_outputs_of_real_inputs_are_differentiated():
    def bad_fft_backward(x):
        return FFTForgetsScale.apply(x)

    class FFTForgetsScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.fft.fft(x)

        @staticmethod
        def backward(ctx, grad):
            return torch.fft.ifft(grad).real  # wrong: the adjoint of fft is n * ifft

    good = run_checks(torch.fft.fft, torch.randn(6), checks=["gradcheck", "gradgradcheck"])
    bad = run_checks(bad_fft_backward, torch.randn(6), checks=["gradcheck"])
    assert [o.status for o in good] == ["passed", "passed"], good
    assert bad[0].status == "failed" and "w.r.t. `x`" in bad[0].detail, bad


def test_a_complex_constant_is_not_differentiated():
    outcomes = run_checks(lambda x, phase: (x * phase).real, torch.randn(3), torch.randn(3, dtype=torch.complex64),
                          checks=["gradcheck"], constants=("phase",))
    assert [o.status for o in outcomes] == ["passed"], outcomes
