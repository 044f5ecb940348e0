"""What the sizes check costs next to gradcheck + gradgradcheck, on every shipped example op.

Each cell is the median wall time of ``run_checks(op, samples=..., checks=...)``
over ``--repeat`` runs after one untimed warm-up, the two sides timed in turn
so a change in the machine's load hits both. The ratio per op is
sizes / (gradcheck + gradgradcheck); its median over the ops is the figure
docs/checks/sizes.md quotes.

    python benchmarks/bench_sizes.py
    python benchmarks/bench_sizes.py --threads 1 --repeat 9
    python benchmarks/bench_sizes.py --no-reference     # the finite-difference strategy instead of the reference's
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_autograd import Sample  # noqa: E402
from pytest_autograd.engine.api import run_checks  # noqa: E402
from reference_ops import EXAMPLES  # noqa: E402

BASELINE = ("gradcheck", "gradgradcheck")


def timed(example, samples, checks, reference):
    start = time.perf_counter()
    outcomes = run_checks(example.function, samples=samples, reference=reference, checks=list(checks))
    seconds = time.perf_counter() - start
    failed = [o for o in outcomes if o.status == "failed"]
    return seconds * 1000, failed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per cell (median reported)")
    parser.add_argument("--ops", nargs="*", default=list(EXAMPLES), help="EXAMPLES keys to time")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--no-reference", action="store_true", help="run without the examples' references")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # notes are warnings; they are not what is measured

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeat} runs, ms, "
          f"{'without' if args.no_reference else 'with'} the examples' references")
    print(f"{'op':28s}{'sizes':>10s}{'gc+ggc':>10s}{'ratio':>8s}")
    ratios = []
    for name in args.ops:
        example = EXAMPLES[name]
        samples = [Sample(*s) for s in example.samples(generator=torch.Generator().manual_seed(0))]
        reference = None if args.no_reference else example.reference
        for checks in (("sizes",), BASELINE):  # warm-up: imports, first calls
            timed(example, samples, checks, reference)
        sizes, baseline = [], []
        for _ in range(args.repeat):
            ms, failed = timed(example, samples, ("sizes",), reference)
            if failed:
                raise SystemExit(f"{name}: sizes failed on a correct op:\n{failed[0].detail}")
            sizes.append(ms)
            baseline.append(timed(example, samples, BASELINE, reference)[0])
        ratio = statistics.median(sizes) / statistics.median(baseline)
        ratios.append(ratio)
        print(f"{name:28s}{statistics.median(sizes):10.1f}{statistics.median(baseline):10.1f}{ratio:8.2f}")
    print(f"median ratio sizes / (gradcheck + gradgradcheck): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
