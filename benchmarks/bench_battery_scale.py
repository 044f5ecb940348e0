"""The battery at scale against torch's fast-mode gradcheck + gradgradcheck, measured in the same run.

For every op family of ``reference_ops.scale.FAMILIES`` (elementwise GELU,
row-wise layer norm and softmax, attention's batched matmuls, a linear
layer) and every size (elements in the largest argument), times, on CPU and
in one process:

  * torch's pair: ``torch.autograd.gradcheck(fast_mode=True)`` +
    ``gradgradcheck(fast_mode=True)`` on float64 copies (the anchor);
  * the plugin's gradcheck + gradgradcheck (``run_checks``);
  * the plugin's whole default battery (``run_checks`` with the family's
    reference), with each check's share;
  * with ``--pytest``, the same battery as pytest runs it: one item per
    check, the items sharing one case (``pytest_adapter/shared_cases``; the
    sum of the items' call phases);

and prints the ratios the goals are stated in (each repeat's time over the
anchor timed just before it, the median of those): pair / anchor (goal <=
1.0), battery / anchor (goal <= 2.5), and battery at the largest size over the
battery at 1M (goal <= 4.5 for 4x the elements). Each figure is the median
of ``--repeat`` runs, the measurements of one repeat taken back to back so
that load on a shared machine hits them alike. Every verdict must be a pass:
a failure is printed and ends the run with status 1. Times are the
process's CPU time by default (``--clock wall`` for elapsed time): with one
thread it is the work done, which other processes on a shared machine do
not inflate the way they inflate elapsed time.

Each size is measured after one untimed run of torch's pair on it. The
summary also prints the anchor's own growth from 1M to 4M: float64
tensors of 4M elements (32 MiB) lie past glibc's largest mmap threshold,
so every one of them is a fresh mapping whose pages fault in on first
touch, and caches no longer hold them; an op's own calls then cost more
per element at 4M than at 1M, for torch's pair as for the battery.
``THP_MEM_ALLOC_ENABLE=1`` (torch's 2 MiB pages for large CPU tensors)
removes most of the faults; the header says whether it was set. The
plugin's checks on a CPU sample of 2**20 elements or more keep freed memory
in glibc's heap (``engine/freed_memory``); ``PYTEST_AUTOGRAD_MALLOPT=0``
measures them without.

``--detection`` instead runs the planted-bug twins at every size and prints
which check caught each (gradgradcheck must catch the double-backward bugs
of ``reference_ops.scale``; gradcheck the wrong single element).

    OMP_NUM_THREADS=1 python benchmarks/bench_battery_scale.py
    python benchmarks/bench_battery_scale.py --families gelu --sizes 1M 4M --repeat 3 --threads 1
    python benchmarks/bench_battery_scale.py --detection --sizes 256k 1M 4M
    python benchmarks/bench_battery_scale.py --clock wall --isolate off     # against the default, explore

``--isolate`` chooses where the checks run (docs/isolation.md): the default
runs sizes, noncontiguous and extreme in the sandbox process, whose time only
``--clock wall`` sees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_autograd.engine.api import run_checks  # noqa: E402
from pytest_autograd.engine.builtin import register_builtin_checks  # noqa: E402
from pytest_autograd.engine.case import Sample  # noqa: E402
from pytest_autograd.engine.registry import CheckRegistry  # noqa: E402
from reference_ops.scale import FAMILIES  # noqa: E402

PAIR = ["gradcheck", "gradgradcheck"]
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def parse_size(text):
    """'256k', '1M', '4M' or a plain number of elements."""
    factor = {"k": 1 << 10, "m": 1 << 20}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if factor > 1 else text) * factor)


def size_label(elements):
    return f"{elements / (1 << 20):g}M" if elements >= 1 << 20 else f"{elements // (1 << 10)}k"


class TimedRegistry(CheckRegistry):
    """The built-in checks, each run timed: ``seconds[name]`` accumulates."""

    def __init__(self):
        super().__init__()
        register_builtin_checks(self)
        self.seconds = {}

    def get(self, name):
        return _Timed(super().get(name), self.seconds)


class _Timed:
    def __init__(self, check, seconds):
        self._check, self._seconds = check, seconds

    def __getattr__(self, attribute):
        return getattr(self._check, attribute)

    def run(self, context):
        start = clock()
        try:
            return self._check.run(context)
        finally:
            name = self._check.name
            self._seconds[name] = self._seconds.get(name, 0.0) + clock() - start


def torch_fast_pair(op, args):
    inputs = tuple(a.detach().double().requires_grad_(True) for a in args)
    start = clock()
    assert torch.autograd.gradcheck(op.apply, inputs, fast_mode=True)
    assert torch.autograd.gradgradcheck(op.apply, inputs, fast_mode=True)
    return clock() - start


def ours(family, args, checks, registry=None, reference=None, op=None):
    """Seconds of run_checks; a failed verdict is a finding, printed, and the run's exit status."""
    start = clock()
    outcomes = run_checks(op or family.op, samples=[Sample(*args)], reference=reference, checks=checks,
                          registry=registry, isolate=ours.isolate)
    elapsed = clock() - start
    failed = [o for o in outcomes if o.status == "failed"]
    for outcome in failed:
        print(f"  FAILED {outcome.check}: {outcome.detail}", flush=True)
    if failed:
        ours.failures += len(failed)
    return elapsed, outcomes


ours.failures = 0
ours.isolate = "explore"


PYTEST_BODY = """
import pytest
import torch
from reference_ops.scale import FAMILIES

family = FAMILIES[{name!r}]


@pytest.mark.autograd_op(op=family.op, reference=family.reference)
def test_family():
    return family.samples({elements}, torch.Generator().manual_seed(0))
"""


class _CallPhases:
    """A pytest plugin summing the clock over the items' call phases (the test body and the check)."""

    def __init__(self):
        self.seconds, self.failed = 0.0, []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        start = clock()
        try:
            return (yield)
        finally:
            self.seconds += clock() - start

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.append(report.nodeid)


def via_pytest(name, elements):
    """Seconds of the items' call phases when pytest runs the family's marked test (every default check): what a
    user's run costs, the items sharing the case the first one built."""
    via_pytest.runs += 1
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"test_scale_{name}_{via_pytest.runs}.py"  # a module name of its own: one process
        path.write_text(PYTEST_BODY.format(name=name, elements=elements))
        phases = _CallPhases()
        status = pytest.main([str(path), "-q", "-p", "no:cacheprovider", f"--rootdir={directory}",
                              "--autograd-shrink=0", "--no-header", "--no-summary"], plugins=[phases])
    for nodeid in phases.failed:
        print(f"  FAILED under pytest: {nodeid}", flush=True)
    if status != 0 and not phases.failed:
        print(f"  pytest exited with {status} before checking anything", flush=True)
        phases.failed.append(status)
    ours.failures += len(phases.failed)
    return phases.seconds


via_pytest.runs = 0


def measure(name, family, elements, repeat, pytest_too=False):
    generator = torch.Generator().manual_seed(0)
    args = family.samples(elements, generator)[0]
    torch_fast_pair(family.op, args)  # untimed: the allocator's first touch of this size is paid by nobody
    anchors, pairs, batteries, shares, under_pytest = [], [], [], [], []
    for _ in range(repeat):
        anchors.append(torch_fast_pair(family.op, args))
        pairs.append(ours(family, args, PAIR)[0])
        registry = TimedRegistry()
        seconds, outcomes = ours(family, args, None, registry=registry, reference=family.reference)
        batteries.append(seconds)
        shares.append(registry.seconds)
        if pytest_too:
            under_pytest.append(via_pytest(name, elements))
    skipped = sorted(o.check for o in outcomes if o.status == "skipped")
    checks = {check: statistics.median(s.get(check, 0.0) for s in shares) for check in shares[0]}
    ratio = lambda times: statistics.median(t / a for t, a in zip(times, anchors))  # noqa: E731
    return {
        "name": name, "elements": elements, "shapes": [tuple(a.shape) for a in args],
        "anchor": statistics.median(anchors), "pair": statistics.median(pairs),
        "battery": statistics.median(batteries), "checks": checks, "skipped": skipped,
        "pytest": statistics.median(under_pytest) if under_pytest else None,
        # each repeat's ratio to the anchor timed just before it, then their median: load that drifts over a run
        # moves both sides of a ratio alike
        "ratios": {"pair": ratio(pairs), "battery": ratio(batteries),
                   "pytest": ratio(under_pytest) if under_pytest else None},
    }


def warm_up(names):
    """One untimed run of everything on small samples: imports (torch's gradcheck loads sympy) and first calls."""
    for name in names:
        family = FAMILIES[name]
        args = family.samples(1 << 12, torch.Generator().manual_seed(0))[0]
        torch_fast_pair(family.op, args)
        ours(family, args, None, reference=family.reference)


def report(row):
    anchor = row["anchor"]
    shapes = " ".join("x".join(map(str, s)) for s in row["shapes"])
    print(f"\n{row['name']} {size_label(row['elements'])} ({shapes})")
    print(f"  torch fast pair (anchor)       {anchor:8.2f} s")
    ratios = row["ratios"]
    print(f"  ours gradcheck + gradgradcheck {row['pair']:8.2f} s   {ratios['pair']:5.2f}x   (goal <= 1.0x)")
    print(f"  ours default battery           {row['battery']:8.2f} s   {ratios['battery']:5.2f}x   "
          "(goal <= 2.5x)")
    if row["pytest"] is not None:
        print(f"  the battery under pytest          {row['pytest']:8.2f} s   {ratios['pytest']:5.2f}x   "
              "(its items' call phases, sharing one case)")
    ranked = sorted(row["checks"].items(), key=lambda item: -item[1])
    print("  per check: " + ", ".join(f"{check} {seconds:.2f}" for check, seconds in ranked if seconds >= 0.005))
    if row["skipped"]:
        print("  skipped: " + ", ".join(row["skipped"]))


def summary(rows):
    print("\nsummary (median seconds; ratios to torch's fast pair in the same run)")
    with_pytest = any(row["pytest"] is not None for row in rows)
    print(f"{'op':<12}{'size':>6}{'anchor':>9}{'pair':>9}{'ratio':>7}{'battery':>9}{'ratio':>7}{'growth':>8}"
          f"{'anchor growth':>15}" + (f"{'pytest':>9}{'ratio':>7}" if with_pytest else ""))
    by_key = {(row["name"], row["elements"]): row for row in rows}
    for row in rows:
        one = by_key.get((row["name"], 1 << 20))
        grown = one and row["elements"] > 1 << 20
        growth = f"{row['battery'] / one['battery']:7.2f}x" if grown else ""
        anchor_growth = f"{row['anchor'] / one['anchor']:14.2f}x" if grown else ""
        print(f"{row['name']:<12}{size_label(row['elements']):>6}{row['anchor']:9.2f}{row['pair']:9.2f}"
              f"{row['ratios']['pair']:6.2f}x{row['battery']:9.2f}{row['ratios']['battery']:6.2f}x"
              f"{growth:>8}{anchor_growth:>15}"
              + (f"{row['pytest']:9.2f}{row['ratios']['pytest']:6.2f}x" if row["pytest"] is not None else ""))
    print("goals: pair <= 1.0x, battery <= 2.5x, growth (battery at 4M / at 1M) <= 4.5x; anchor growth: torch's pair "
          "at 4M / at 1M in the same run, what the op's own calls cost more on this machine")


def detection(names, sizes):
    """Planted bugs at every size: each must fail the check that catches it."""
    from reference_ops import buggy, scale

    cases = [
        ("layer_norm", scale.LayerNormAffineSavesRstd, "gradgradcheck"),
        ("attention", scale.AttentionSavesProbabilities, "gradgradcheck"),
        ("linear", buggy.LinearWeightGradTransposed, "gradcheck"),
        ("linear", buggy.LinearGradInputWrong, "gradcheck"),
        ("linear", buggy.LinearFloat32Backward, "grad_metadata"),  # float32 samples: only float64 shows it
        ("linear", buggy.LinearContiguousAssumption, "noncontiguous"),
        ("linear", buggy.LinearSavesCtxAttributes, "leak"),
    ]
    missed = 0
    for family_name, op, check in cases:
        if names and family_name not in names:
            continue
        family = FAMILIES[family_name]
        for elements in sizes:
            args = family.samples(elements, torch.Generator().manual_seed(0))[0]
            # a derivative check alone, and as the battery runs it: after or before the other, sharing their work
            for checks in [[check]] + ([PAIR] if check in PAIR else []):
                start = clock()
                outcomes = run_checks(op, samples=[Sample(*args)], reference=family.reference, checks=checks)
                elapsed = clock() - start
                outcome = next(o for o in outcomes if o.check == check)
                caught = outcome.status == "failed"
                missed += not caught
                first = outcome.detail.splitlines()[0] if outcome.detail else ""
                label = check if len(checks) == 1 else f"{check} (pair)"
                print(f"{op.__name__:<32}{size_label(elements):>6} {label:<21}{'caught' if caught else 'MISSED':<8}"
                      f"{elapsed:7.2f} s  {first[:90]}", flush=True)
    return missed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--sizes", nargs="*", default=["256k", "1M", "4M"], help="elements per argument")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a shared machine)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                        help="cpu: the process's CPU time (steady on a shared machine with --threads 1); wall: elapsed")
    parser.add_argument("--detection", action="store_true", help="planted bugs at every size instead of timings")
    parser.add_argument("--isolate", choices=["explore", "all", "off"], default="explore",
                        help="where the checks run (docs/isolation.md); the sandbox's time counts with --clock wall")
    parser.add_argument("--pytest", action="store_true",
                        help="also time the battery as pytest runs it: one item per check, sharing one case")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    ours.isolate = args.isolate
    if args.isolate != "off" and args.clock == "cpu":
        print("note: --clock cpu counts this process only, not the sandbox's work: compare isolation modes with "
              "--clock wall", flush=True)
    sizes = [parse_size(s) for s in args.sizes]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} time, median of {args.repeat}, "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}, "
          f"PYTEST_AUTOGRAD_MALLOPT={os.environ.get('PYTEST_AUTOGRAD_MALLOPT', 'unset')}", flush=True)
    if args.detection:
        return 1 if detection(args.families, sizes) else 0
    warm_up(args.families)
    rows = []
    for name in args.families:
        for elements in sizes:
            rows.append(measure(name, FAMILIES[name], elements, args.repeat, pytest_too=args.pytest))
            report(rows[-1])
            sys.stdout.flush()
    summary(rows)
    return 1 if ours.failures else 0


if __name__ == "__main__":
    sys.exit(main())
