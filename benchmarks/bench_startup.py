"""What the plugin costs a project that has no autograd tests: pytest's wall time on 50 plain tests, with the
plugin and with ``-p no:autograd``, in alternating pairs so that a change in the machine's load hits both.

    python benchmarks/bench_startup.py            # 25 pairs
    python benchmarks/bench_startup.py --pairs 50
    python benchmarks/bench_startup.py --no-bytecode   # every module of the package compiled on every run

Prints both medians, their difference (the plugin's cost per session) and the import time of
``pytest_autograd.plugin`` alone (``python -X importtime``), the anchor being the run without the plugin.
The plugin's cost is the code it loads: with ``--no-bytecode`` (``PYTHONDONTWRITEBYTECODE=1``, as in some CI
images and for an editable install that never wrote its ``.pyc`` files) it is compiled on every run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A normal install keeps bytecode; without it (PYTHONDONTWRITEBYTECODE, set in some CI images) every module is
# compiled on every run and the numbers measure the compiler too (--no-bytecode).
CACHED = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
UNCACHED = {**CACHED, "PYTHONDONTWRITEBYTECODE": "1"}
PLAIN_TESTS = "".join(f"def test_{index}():\n    assert {index} + 1 > {index}\n\n\n" for index in range(50))


def one_run(folder, env, *extra):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra], cwd=folder,
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "50 passed" not in done.stdout:
        raise SystemExit(f"pytest failed:\n{done.stdout}\n{done.stderr}")
    return seconds


# What pytest imports of the package in every session: the entry point, then the plugins it registers.
PLUGIN_MODULES = ("pytest_autograd.plugin", "pytest_autograd.pytest_adapter.bench",
                  "pytest_autograd.pytest_adapter.reporting")


def plugin_import_ms(env):
    code = "import pytest; " + "; ".join(f"import {module}" for module in PLUGIN_MODULES)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, env=env)
    rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")]
    ours = [int(row[1]) for row in rows if row[2].rstrip() in {f" {module}" for module in PLUGIN_MODULES}]
    return sum(ours) / 1000 if ours else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--no-bytecode", action="store_true",
                        help="write no .pyc files (PYTHONDONTWRITEBYTECODE=1): modules without one are compiled on "
                             "every run")
    args = parser.parse_args(argv)
    env = UNCACHED if args.no_bytecode else CACHED
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_plain.py").write_text(PLAIN_TESTS)
        one_run(folder, env)  # warm the file system cache and the bytecode of both setups
        one_run(folder, env, "-p", "no:autograd")
        with_plugin, without = [], []
        for _ in range(args.pairs):
            with_plugin.append(one_run(folder, env))
            without.append(one_run(folder, env, "-p", "no:autograd"))
    differences = [a - b for a, b in zip(with_plugin, without)]
    bytecode = "no .pyc written" if args.no_bytecode else ".pyc files kept"
    print(f"50 plain tests, {args.pairs} alternating pairs, {bytecode}, {sys.executable}")
    print(f"  without the plugin (-p no:autograd): median {statistics.median(without) * 1e3:.0f} ms")
    print(f"  with the plugin:                     median {statistics.median(with_plugin) * 1e3:.0f} ms")
    print(f"  the plugin's cost: median of paired differences {statistics.median(differences) * 1e3:+.1f} ms")
    print(f"  importing the plugin's modules (after pytest): {plugin_import_ms(env):.1f} ms")


if __name__ == "__main__":
    main()
