"""Time every registered check on every example op: op x check -> milliseconds.

Each cell is the median wall time of ``run_checks(op, samples=..., checks=[name])``
over ``--repeat`` runs after one untimed warm-up run (which imports the
check's module and warms torch's kernels). Checks are whatever the plugin's
registry holds when this runs, so checks added later show up on their own.

Cell suffixes: ``s`` the check was skipped (does not apply; the time is what
deciding that cost), ``F`` it failed (a correct op should not fail: look),
``E`` the check itself raised. Totals compare the core checks (gradcheck,
gradgradcheck, parity, reference) with all checks.

    python benchmarks/bench_checks.py
    python benchmarks/bench_checks.py --repeat 9 --ops linear relu --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_autograd.engine.builtin import register_builtin_checks  # noqa: E402
from pytest_autograd.engine.api import run_checks  # noqa: E402
from pytest_autograd.engine.registry import CheckRegistry  # noqa: E402
from reference_ops import EXAMPLES  # noqa: E402

CORE = ("gradcheck", "gradgradcheck", "parity", "reference")


def registered_checks():
    registry = CheckRegistry()
    register_builtin_checks(registry)
    return registry


def time_check(registry, example, name, device, repeat):
    """(median ms, status letter) of one check on one example op."""
    samples = example.samples(generator=torch.Generator().manual_seed(0))

    def once():
        start = time.perf_counter()
        try:
            outcomes = run_checks(example.function, samples=samples, reference=example.reference, checks=[name],
                                  devices=(device,), registry=registry)
            status = outcomes[0].status
        except Exception as error:  # a check that raises is a result worth showing, not a crash
            status = f"error: {type(error).__name__}: {error}"
        return (time.perf_counter() - start) * 1000, status

    _, status = once()
    times = [once()[0] for _ in range(repeat)]
    letter = {"passed": "", "skipped": "s", "failed": "F"}.get(status, "E")
    return statistics.median(times), letter


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per cell (median reported)")
    parser.add_argument("--ops", nargs="*", default=list(EXAMPLES), help="EXAMPLES keys to time")
    parser.add_argument("--checks", nargs="*", default=None, help="check names (default: every registered one)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    registry = registered_checks()
    names = args.checks or registry.names()
    rows = {}
    for op in args.ops:
        rows[op] = {name: time_check(registry, EXAMPLES[op], name, args.device, args.repeat) for name in names}

    width = max(len(op) for op in rows) + 2
    widths = {name: max(8, len(name) + 2) for name in names}
    header = "op".ljust(width) + "".join(name.rjust(widths[name]) for name in names) + "core".rjust(9) + "all".rjust(9)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
          f"median of {args.repeat} runs, ms")
    print(header)
    print("-" * len(header))
    totals = {name: 0.0 for name in names}
    for op, cells in rows.items():
        line = op.ljust(width)
        for name in names:
            ms, letter = cells[name]
            totals[name] += ms
            line += f"{ms:.1f}{letter}".rjust(widths[name])
        core = sum(cells[name][0] for name in names if name in CORE)
        every = sum(ms for ms, _ in cells.values())
        print(line + f"{core:.1f}".rjust(9) + f"{every:.1f}".rjust(9))
    print("-" * len(header))
    core_total = sum(totals[name] for name in names if name in CORE)
    print("total".ljust(width) + "".join(f"{totals[name]:.1f}".rjust(widths[name]) for name in names)
          + f"{core_total:.1f}".rjust(9) + f"{sum(totals.values()):.1f}".rjust(9))
    print("s = skipped (does not apply), F = failed, E = the check raised")


if __name__ == "__main__":
    main()
