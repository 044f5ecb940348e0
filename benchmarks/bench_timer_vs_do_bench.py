"""The bench timer against triton's do_bench, and what pytest-benchmark reports without a sync.

On one CUDA op this prints, side by side:
  * pytest-autograd's timer (``pytest_autograd.bench.timers.measure``), cold and warm L2;
  * ``triton.testing.do_bench`` (events per call, L2 cleared between calls), when triton is installed;
  * pytest-benchmark's own number for the same op, run through its ``benchmark`` fixture,
    which never synchronises CUDA, so it times the kernel *launch*, not the kernel;
  * the same op timed by hand with a synchronize after every call (the honest wall clock).

Expect the first two to agree within a few percent, and pytest-benchmark to read
far below them for anything GPU-bound. Without CUDA the script says so and exits 0.

Run:  python benchmarks/bench_timer_vs_do_bench.py [--size 4096] [--dtype float16] [--op matmul|add|linear]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

from pytest_autograd.bench.config import TimerConfig
from pytest_autograd.bench.stats import fmt_percent, fmt_time
from pytest_autograd.bench.timers import measure

OPS = {
    # name: (setup code making tensors `a`, `b` of the requested size, statement)
    "matmul": ("a = torch.randn(n, n, device='cuda', dtype=dtype); b = torch.randn(n, n, device='cuda', dtype=dtype)",
               "a @ b"),
    "add": ("a = torch.randn(n * 256, device='cuda', dtype=dtype); "
            "b = torch.randn(n * 256, device='cuda', dtype=dtype)", "a + b"),
    "linear": ("a = torch.randn(n, n, device='cuda', dtype=dtype); b = torch.randn(n, n, device='cuda', dtype=dtype)",
               "torch.nn.functional.linear(a, b)"),
}


def make_op(name, n, dtype):
    setup, statement = OPS[name]
    scope = {"torch": torch, "n": n, "dtype": dtype}
    exec(setup, scope)
    return eval(f"lambda: {statement}", scope), setup, statement


def time_do_bench(fn):
    try:
        from triton.testing import do_bench
    except ImportError:
        return None, "triton is not installed"
    try:
        median_ms = do_bench(fn, quantiles=[0.5])
    except TypeError:  # older triton: no quantiles; return_mode picks the statistic
        median_ms = do_bench(fn, return_mode="median")
    if isinstance(median_ms, (list, tuple)):
        median_ms = median_ms[0]
    return median_ms * 1e-3, "events per call, L2 cleared between calls"


def time_synchronised_wall_clock(fn, seconds=0.5):
    times, deadline = [], time.perf_counter() + seconds
    fn()
    torch.cuda.synchronize()
    while time.perf_counter() < deadline or len(times) < 5:
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def time_pytest_benchmark(setup, statement, n, dtype):
    """pytest-benchmark's median for the op, from its own fixture and JSON (no CUDA sync anywhere)."""
    try:
        import pytest_benchmark  # noqa: F401
    except ImportError:
        return None, "pytest-benchmark is not installed"
    with tempfile.TemporaryDirectory() as folder:
        test = os.path.join(folder, "test_op.py")
        with open(test, "w") as handle:
            handle.write(textwrap.dedent(f"""
                import torch
                n, dtype = {n}, torch.{str(dtype).replace('torch.', '')}
                {setup}

                def test_op(benchmark):
                    benchmark(lambda: {statement})
                    torch.cuda.synchronize()
            """))
        out = os.path.join(folder, "out.json")
        done = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider",
                               "-p", "no:xdist", f"--benchmark-json={out}"], capture_output=True, text=True,
                              cwd=folder, timeout=600)
        if done.returncode != 0 or not os.path.exists(out):
            return None, "pytest-benchmark run failed:\n" + done.stdout[-2000:] + done.stderr[-2000:]
        with open(out) as handle:
            stats = json.load(handle)["benchmarks"][0]["stats"]
    return stats["median"], f"{stats['rounds']} rounds, no sync"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=sorted(OPS), default="matmul")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timing for pytest-autograd's timer")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}, "
              f"{'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'}): "
              "this comparison needs a GPU; nothing to do.")
        return 0
    dtype = getattr(torch, args.dtype)
    fn, setup, statement = make_op(args.op, args.size, dtype)
    print(f"{args.op} n={args.size} {args.dtype} on {torch.cuda.get_device_name()} "
          f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    rows = []
    for cache in ("cold", "warm"):
        result = measure(fn, "cuda", TimerConfig(budget=args.budget, cache=cache))
        rows.append((f"pytest-autograd ({cache} L2)", result.median,
                     f"IQR {fmt_percent(result.noise)} of median, {result.rounds} rounds, stopped on {result.stop}"))
    median, note = time_do_bench(fn)
    rows.append(("triton do_bench", median, note))
    rows.append(("wall clock, sync per call", time_synchronised_wall_clock(fn), "includes launch + sync overhead"))
    median, note = time_pytest_benchmark(setup, statement, args.size, dtype)
    rows.append(("pytest-benchmark", median, note))
    width = max(len(name) for name, _, _ in rows)
    reference = rows[0][1]
    for name, value, note in rows:
        ratio = f"{value / reference:6.2f}x" if value else "     - "
        print(f"  {name.ljust(width)}  {fmt_time(value).rjust(9)}  {ratio}  {note}")
    print("ratio: against pytest-autograd (cold L2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
