"""The determinism check runs forward and backward twice and reports the largest difference."""

import textwrap

NONDETERMINISTIC = """
import pytest, torch
from reference_ops import MyReLU
from reference_ops.buggy import ReLUNondeterministic

SAMPLES = [(torch.linspace(0.5, 3.0, 24).reshape(4, 6),)]  # all positive: every gradient element is noisy

@pytest.mark.autograd_op(op=ReLUNondeterministic{options})
def test_noisy_relu():
    return SAMPLES

@pytest.mark.autograd_op(op=MyReLU)
def test_relu():
    return SAMPLES
"""


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=determinism", *args)


def test_determinism_reports_the_largest_difference_between_two_runs(pytester, run_pytest):
    result = run(pytester, run_pytest, NONDETERMINISTIC.format(options=""))
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*two runs on the same inputs differ: gradient w.r.t. `x` changes by up to * (nondet_tol 0)",
        "*check determinism, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*worst element: grad x[[]*[]]: first run *, second run *",
        "*largest difference * > nondet_tol 0; * of 24 elements differ",
        "*hint: *declare the accepted bound with nondet_tol=<max abs difference> on the marker",
    ])


def test_determinism_accepts_differences_within_nondet_tol(pytester, run_pytest):
    result = run(pytester, run_pytest, NONDETERMINISTIC.format(options=", nondet_tol=1e-3"))
    result.assert_outcomes(passed=2)


def test_determinism_catches_a_race_that_reseeding_does_not_explain(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import itertools
        import pytest, torch

        CALLS = itertools.count()

        class SumInVaryingOrder(torch.autograd.Function):
            # stands in for atomics: the summation order changes from call to call
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                values = torch.roll(x.reshape(-1), next(CALLS))
                total = torch.zeros((), dtype=x.dtype)
                for value in values:   # float32 rounding at every step, in a varying order
                    total = total + value
                return total

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return grad.expand_as(x).clone()

        @pytest.mark.autograd_op(op=SumInVaryingOrder)
        def test_sum():
            return [(torch.randn(64) * torch.logspace(-3, 3, 64),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*two runs on the same inputs differ: output changes by up to *"])
    assert "reseeded" not in result.stdout.str()


def test_determinism_rejects_a_negative_nondet_tol(pytester, run_pytest):
    result = run(pytester, run_pytest, NONDETERMINISTIC.format(options=", nondet_tol=-1"))
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*nondet_tol= must be a non-negative number*got -1*"])


def test_determinism_compares_the_imaginary_part_of_complex_outputs():
    import torch

    from pytest_autograd.checks._hygiene import max_difference

    a = torch.complex(torch.zeros(3), torch.zeros(3))
    b = torch.complex(torch.zeros(3), torch.tensor([0.0, 0.5, 0.0]))
    largest, index, count = max_difference(a, b)
    assert (largest, count) == (0.5, 1) and index[0] == 1


def test_an_op_drawing_noise_from_torchs_generator_passes_determinism_with_a_note(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.noise import GaussianNoise, noise_samples

        @pytest.mark.autograd_op(op=GaussianNoise)
        def test_noise():
            return noise_samples(torch.Generator().manual_seed(0))
    """, "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*determinism: the op draws random numbers from torch's global generator (two runs "
                                 "differ); judged with the generator reseeded before each run, where they are equal*"])
