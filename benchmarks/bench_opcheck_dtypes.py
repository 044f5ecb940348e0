"""Cost of opcheck's other-dtype copies, as a ratio to opcheck on the samples' own dtype alone.

gradcheck on the same op and samples is timed in the same run as an anchor.
Each number is the median of ``--repeat`` runs after one warm-up.

    python benchmarks/bench_opcheck_dtypes.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pytest_autograd.checks.opcheck as opcheck  # noqa: E402
from pytest_autograd.engine.api import run_checks  # noqa: E402
from reference_ops.transforms import row_sum, scaled_sin  # noqa: E402


def median_seconds(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    ops = {
        "scaled_sin": (scaled_sin, [(torch.randn(3, 4), 2.0), (torch.randn(5), -0.5)]),
        "row_sum": (row_sum, [(torch.randn(3, 4),), (torch.randn(2, 5),)]),
    }
    copies = opcheck.other_dtype_copies
    for name, (op, samples) in ops.items():
        def run(check):
            return lambda: run_checks(op, samples=samples, checks=[check])

        anchor = median_seconds(run("gradcheck"), args.repeat)
        opcheck.other_dtype_copies = lambda sample: []
        own = median_seconds(run("opcheck"), args.repeat)
        opcheck.other_dtype_copies = copies
        every = median_seconds(run("opcheck"), args.repeat)
        print(f"{name}: opcheck own dtype {own / anchor:.1f}x gradcheck; with float64/float16/bfloat16 copies "
              f"{every / anchor:.1f}x gradcheck = {every / own:.2f}x own-dtype opcheck")


if __name__ == "__main__":
    main()
