"""What checking an op across ranks costs: forming the ranks once, then each check against the same check on the
single-process op the layer stands for, on the same global tensors.

    python benchmarks/bench_distributed.py [--world 2] [--repeat 3]

The op across ranks is reference_ops.distributed.ColumnParallelLinear (``weight`` and ``bias`` sharded along the
output features, the output along its last dim, gloo on CPU); the anchor is reference_ops.LinearFunction run in
this process on the same global tensors (x (8, 16), weight (12, 16), bias (12)). Each figure is the median of
``--repeat`` runs of ``run_checks`` with that one check; the ratio is across ranks / one process.
"""

import argparse
import statistics
import time

import torch
from torch.distributed.tensor import Shard

from pytest_autograd import run_checks
from pytest_autograd.engine.distributed import JUDGED_ACROSS_RANKS
from reference_ops import LinearFunction
from reference_ops.distributed import ColumnParallelLinear


def samples():
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(8, 16, generator=generator), torch.randn(12, 16, generator=generator),
            torch.randn(12, generator=generator))


def timed(op, check, **options):
    start = time.perf_counter()
    (outcome,) = run_checks(op, *samples(), reference=torch.nn.functional.linear, checks=[check], **options)
    return time.perf_counter() - start, outcome.status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    layout = dict(world_size=args.world, placements={"weight": Shard(0), "bias": Shard(0)},
                  output_placements=Shard(-1))
    first, status = timed(ColumnParallelLinear, "requires_grad", **layout)
    print(f"first call across {args.world} ranks (the process group formed): {first:.2f} s ({status})")
    print(f"{'check':<15} {'ranks s':>9} {'1 process s':>12} {'ratio':>7}  verdicts")
    for check in sorted(JUDGED_ACROSS_RANKS):
        across = [timed(ColumnParallelLinear, check, **layout) for _ in range(args.repeat)]
        alone = [timed(LinearFunction, check) for _ in range(args.repeat)]
        a, b = statistics.median(t for t, _ in across), statistics.median(t for t, _ in alone)
        print(f"{check:<15} {a:>9.3f} {b:>12.3f} {a / b:>7.1f}  {across[0][1]} / {alone[0][1]}")


if __name__ == "__main__":
    main()
