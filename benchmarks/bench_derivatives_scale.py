"""Derivative checks at scale against torch's fast mode, side by side in one run.

Times, on CPU and in the same process:
  * LinearFunction, 1024x640 input, 512x640 weight: torch.autograd.gradcheck(fast_mode=True) +
    gradgradcheck(fast_mode=True), against pytest-autograd's gradcheck + gradgradcheck, and against
    its whole default battery (with reference=F.linear);
  * Cube on a 3000x3000 input: gradgradcheck, torch fast mode against pytest-autograd;
and prints every time with the ratio to its torch anchor (best of --repeat runs each).

Run:  python benchmarks/bench_derivatives_scale.py [--repeat 2]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from pytest_autograd.engine.api import run_checks
from reference_ops import Cube, LinearFunction


def best_of(repeat, fn):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def torch_fast(op, args, order):
    inputs = tuple(a.detach().double().requires_grad_(True) for a in args)
    check = torch.autograd.gradcheck if order == 1 else torch.autograd.gradgradcheck
    assert check(op.apply, inputs, fast_mode=True)


def ours(op, args, checks, reference=None):
    outcomes = run_checks(op, *args, checks=checks, reference=reference)
    failed = [o for o in outcomes if o.status == "failed"]
    assert not failed, failed[0].detail


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    options = parser.parse_args()
    torch.manual_seed(0)
    repeat = options.repeat
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; seconds, best of {repeat}\n")

    x, w, b = torch.randn(1024, 640), torch.randn(512, 640), torch.randn(512)
    args = (x, w, b)
    t_fast = best_of(repeat, lambda: torch_fast(LinearFunction, args, 1))
    t_ggfast = best_of(repeat, lambda: torch_fast(LinearFunction, args, 2))
    t_grad = best_of(repeat, lambda: ours(LinearFunction, args, ["gradcheck"]))
    t_gg = best_of(repeat, lambda: ours(LinearFunction, args, ["gradgradcheck"]))
    t_all = best_of(repeat, lambda: ours(LinearFunction, args, None, F.linear))
    anchor = t_fast + t_ggfast
    print("LinearFunction, input 1024x640, weight 512x640, bias 512")
    print(f"  torch gradcheck(fast_mode=True)             {t_fast:8.3f}")
    print(f"  torch gradgradcheck(fast_mode=True)         {t_ggfast:8.3f}")
    print(f"  torch fast pair (anchor)                    {anchor:8.3f}")
    print(f"  ours gradcheck                              {t_grad:8.3f}")
    print(f"  ours gradgradcheck                          {t_gg:8.3f}")
    print(f"  ours gradcheck + gradgradcheck              {t_grad + t_gg:8.3f}   ratio {(t_grad + t_gg) / anchor:5.2f}x")
    print(f"  ours whole default battery                  {t_all:8.3f}   ratio {t_all / anchor:5.2f}x")

    big = (torch.randn(3000, 3000),)
    t_big_fast = best_of(repeat, lambda: torch_fast(Cube, big, 2))
    t_big = best_of(repeat, lambda: ours(Cube, big, ["gradgradcheck"]))
    print("\nCube, input 3000x3000")
    print(f"  torch gradgradcheck(fast_mode=True)         {t_big_fast:8.3f}")
    print(f"  ours gradgradcheck                          {t_big:8.3f}   ratio {t_big / t_big_fast:5.2f}x")


if __name__ == "__main__":
    main()
