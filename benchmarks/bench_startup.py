"""What the plugin costs a project that has no autograd tests: pytest's wall time on 50 plain tests, with the
plugin and with ``-p no:autograd``, in alternating pairs so that a change in the machine's load hits both.

    python benchmarks/bench_startup.py            # 25 pairs
    python benchmarks/bench_startup.py --pairs 50

Prints both medians, their difference (the plugin's cost per session) and the import time of
``pytest_autograd.plugin`` alone (``python -X importtime``), the anchor being the run without the plugin.
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
# compiled on every run and the numbers measure the compiler.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
PLAIN_TESTS = "".join(f"def test_{index}():\n    assert {index} + 1 > {index}\n\n\n" for index in range(50))


def one_run(folder, *extra):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra], cwd=folder,
                          capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "50 passed" not in done.stdout:
        raise SystemExit(f"pytest failed:\n{done.stdout}\n{done.stderr}")
    return seconds


def plugin_import_ms():
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import pytest; import pytest_autograd.plugin"],
                          capture_output=True, text=True, env=ENV)
    rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")]
    ours = [int(row[1]) for row in rows if row[2].strip() == "pytest_autograd.plugin"]
    return ours[0] / 1000 if ours else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=25)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_plain.py").write_text(PLAIN_TESTS)
        one_run(folder)  # warm the file system cache and the bytecode of both setups
        one_run(folder, "-p", "no:autograd")
        with_plugin, without = [], []
        for _ in range(args.pairs):
            with_plugin.append(one_run(folder))
            without.append(one_run(folder, "-p", "no:autograd"))
    differences = [a - b for a, b in zip(with_plugin, without)]
    print(f"50 plain tests, {args.pairs} alternating pairs, {sys.executable}")
    print(f"  without the plugin (-p no:autograd): median {statistics.median(without) * 1e3:.0f} ms")
    print(f"  with the plugin:                     median {statistics.median(with_plugin) * 1e3:.0f} ms")
    print(f"  the plugin's cost: median of paired differences {statistics.median(differences) * 1e3:+.1f} ms")
    print(f"  importing pytest_autograd.plugin (after pytest): {plugin_import_ms():.1f} ms")


if __name__ == "__main__":
    main()
