"""Cost and power of pytest-autograd's derivative checks vs torch.autograd.gradcheck.

For each op this times, on CPU and in the same run:
  * pytest-autograd's gradcheck, gradgradcheck, parity and reference checks;
  * torch.autograd.gradcheck in fast mode and (where it fits in memory and
    a minute) in slow mode, and torch.autograd.gradgradcheck in fast mode;
and, for planted bugs confined to a few elements, which of them notice.

Run:  python benchmarks/bench_gradcheck.py [--quick]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from pytest_autograd.engine.api import run_checks
from reference_ops import Cube, LinearFunction
from reference_ops.buggy import CubeWrongAtOneElement


class LinearLastWeightRowWrong(torch.autograd.Function):
    """Planted bug: the weight gradient's last row is scaled by 1.5 (a tile-edge bug)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        grad_w = g.t() @ x
        grad_w[-1] *= 1.5
        return g @ w, grad_w, g.sum(0)


def timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def torch_gradcheck(op, args, fast, order=1):
    inputs = tuple(a.detach().double().requires_grad_(True) if a.is_floating_point() else a for a in args)
    check = torch.autograd.gradcheck if order == 1 else torch.autograd.gradgradcheck
    return check(op.apply, inputs, fast_mode=fast, raise_exception=False)


def ours(op, args, checks, reference=None):
    outcomes = run_checks(op, *args, checks=checks, reference=reference)
    return all(o.status != "failed" for o in outcomes)


def slow_mode_cost(args, outputs_numel):
    n_in = sum(a.numel() for a in args if a.is_floating_point())
    return n_in, n_in * outputs_numel * 8 / 1e9  # elements, GB of the float64 Jacobian


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    options = parser.parse_args()
    torch.manual_seed(0)
    rows, cols, out = (64, 96, 128) if options.quick else (256, 320, 384)
    cases = [
        ("linear 8x16->4 (small)", LinearFunction, (torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)), F.linear),
        (f"linear {rows}x{cols}->{out}", LinearFunction,
         (torch.randn(rows, cols), torch.randn(out, cols), torch.randn(out)), F.linear),
        (f"cube {rows}x{cols}", Cube, (torch.randn(rows, cols),), lambda x: x**3),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times in seconds (best of 2)\n")
    header = f"{'op':28} {'inputs':>8} {'ours:grad':>10} {'ours:gg':>9} {'ours:ref':>9} {'ours:all4':>10} " \
             f"{'torch fast':>10} {'torch gg fast':>13} {'torch slow':>12}"
    print(header)
    for label, op, args, reference in cases:
        t_grad, _ = timed(lambda: ours(op, args, ["gradcheck"]), 2)
        t_gg, _ = timed(lambda: ours(op, args, ["gradgradcheck"]), 2)
        t_ref, _ = timed(lambda: ours(op, args, ["reference"], reference), 2)
        t_all, _ = timed(lambda: ours(op, args, ["gradcheck", "gradgradcheck", "parity", "reference"], reference), 2)
        t_fast, _ = timed(lambda: torch_gradcheck(op, args, fast=True), 2)
        t_ggfast, _ = timed(lambda: torch_gradcheck(op, args, fast=True, order=2), 2)
        n_in, jacobian_gb = slow_mode_cost(args, op.apply(*args).numel())
        if n_in <= 5000:
            t_slow, _ = timed(lambda: torch_gradcheck(op, args, fast=False), 1)
            slow = f"{t_slow:12.3f}"
        else:
            slow = f"{'n/a':>4} ({jacobian_gb:.0f} GB)"
        print(f"{label:28} {n_in:8d} {t_grad:10.3f} {t_gg:9.3f} {t_ref:9.3f} {t_all:10.3f} {t_fast:10.3f} "
              f"{t_ggfast:13.3f} {slow:>12}")
        print(f"{'':28} {'ratio ours:all4 / torch fast (grad+gg):':>55} {t_all / (t_fast + t_ggfast):6.1f}x")

    print("\nPlanted bugs confined to a few elements (True = the check noticed):")
    x = torch.randn(rows, cols)
    w, b = torch.randn(out, cols), torch.randn(out)
    bugs = [
        ("cube: last element's grad doubled", CubeWrongAtOneElement, (x,)),
        ("linear: last weight-grad row x1.5", LinearLastWeightRowWrong, (x, w, b)),
    ]
    print(f"{'bug':36} {'ours gradcheck':>15} {'torch fast_mode':>16}")
    for label, op, args in bugs:
        caught_ours = not ours(op, args, ["gradcheck"])
        caught_fast = sum(not torch_gradcheck(op, args, fast=True) for _ in range(5))
        print(f"{label:36} {str(caught_ours):>15} {f'{caught_fast}/5 runs':>16}")


if __name__ == "__main__":
    main()
