"""What shrinking a failing sample costs, and how small it gets, on the planted bugs.

Each planted bug of ``reference_ops/buggy.py`` (and the double-backward
ones of ``reference_ops/known_patterns.py``) runs its default checks on a
sample larger than its example, twice: shrinking off, then on (the default
budget). For each failing item whose check shrinks (gradcheck,
gradgradcheck, reference, parity, precision): the item's time both ways,
the time shrinking took and how many candidates it tried, and the shapes
before and after.

Run:  python benchmarks/shrink_cost.py
"""

import time

import torch

from pytest_autograd.engine.api import run_checks
from pytest_autograd.engine.case import DEFAULT_SHRINK_SECONDS
from reference_ops import buggy, known_patterns, linear_reference, relu_reference, rnn_cell_reference
from reference_ops.functions import cube_reference


def linear(generator):
    return (torch.randn(64, 128, generator=generator), torch.randn(32, 128, generator=generator),
            torch.randn(32, generator=generator))


def rnn_cell(generator):
    sizes = [(16, 24), (16, 32), (32, 24), (32, 32), (32,), (32,)]
    return tuple(torch.randn(*size, generator=generator) for size in sizes)


def away_from_zero(generator, *shape):
    x = torch.randn(*shape, generator=generator)
    return x + 0.1 * torch.sign(x)


CASES = [
    (buggy.LinearWeightGradTransposed, linear, linear_reference),
    (buggy.LinearGradInputWrong, linear, linear_reference),
    (buggy.LinearFloat32Backward, linear, linear_reference),
    (buggy.LinearWeightGradLastColumnTwice, linear, linear_reference),
    (buggy.LinearGradInputFirstRowTwice, linear, linear_reference),
    (buggy.RNNCellMissingTanhDerivative, rnn_cell, rnn_cell_reference),
    (buggy.ReLUPositiveGradOnly, lambda g: (away_from_zero(g, 48, 64),), relu_reference),
    (buggy.CubeWrongAtOneElement, lambda g: (torch.randn(48, 64, generator=g),), cube_reference),
    (buggy.CubeNotDifferentiableBackward, lambda g: (torch.randn(48, 64, generator=g),), cube_reference),
    (known_patterns.GeluSavesCdf, lambda g: (torch.randn(48, 64, generator=g),), torch.nn.functional.gelu),
    (known_patterns.TanhSavesSlope, lambda g: (torch.randn(48, 64, generator=g),), torch.tanh),
]
CHECKS = ["gradcheck", "gradgradcheck", "reference", "precision"]


def shapes(sample):
    return ", ".join(str(tuple(t.shape)) for t in sample if isinstance(t, torch.Tensor))


def timed_outcomes(op, sample, reference, shrink):
    found = {}
    for check in CHECKS:
        start = time.perf_counter()
        (outcome,) = run_checks(op, *sample, reference=reference, checks=[check], shrink=shrink)
        found[check] = (outcome, time.perf_counter() - start)
    return found


def main():
    run_checks(buggy.CubeWrongAtOneElement, torch.randn(3, 4), checks=["gradcheck"])  # one-time costs, not counted
    print(f"shrink budget {DEFAULT_SHRINK_SECONDS:g} s; times in seconds, CPU")
    print(f"{'op':32} {'check':14} {'off':>6} {'on':>6} {'shrink':>7} {'tries':>5}  sizes")
    total_off = total_on = 0.0
    for op, make, reference in CASES:
        sample = make(torch.Generator().manual_seed(0))
        off = timed_outcomes(op, sample, reference, 0)
        on = timed_outcomes(op, sample, reference, DEFAULT_SHRINK_SECONDS)
        for check in CHECKS:
            (_, seconds_off), (outcome_on, seconds_on) = off[check], on[check]
            if outcome_on.status != "failed":
                continue
            total_off, total_on = total_off + seconds_off, total_on + seconds_on
            shrunk = outcome_on.report.shrunk
            if shrunk is None:
                after, spent, tries = "not shrunk (nothing smaller fails the same way)", 0.0, 0
            else:
                after = ", ".join(str(tuple(s)) for s in shrunk["shapes"].values())
                after = f"{after} (was {shapes(sample)})" + ("" if shrunk["complete"] else ", budget spent")
                spent, tries = shrunk["seconds"], shrunk["attempts"]
            print(f"{op.__name__:32} {check:14} {seconds_off:6.2f} {seconds_on:6.2f} {spent:7.2f} {tries:5d}  {after}")
    print(f"all failing items: {total_off:.2f} s without shrinking, {total_on:.2f} s with")


if __name__ == "__main__":
    main()
