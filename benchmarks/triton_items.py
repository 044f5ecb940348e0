"""What a GPU machine should run for the Triton ops, and what each run shows.

On a machine without a GPU the Triton tests run under Triton's interpreter
(``tests/conftest.py`` sets ``TRITON_INTERPRET=1``); these items are the
runs only a GPU can do. Each item is a pytest command, the environment it
needs, and what a good result looks like. A GPU report script can import
:func:`triton_items` and run them; run alone, this file prints them, or runs
them with ``--run`` (exit status: 1 if any run failed)::

    python benchmarks/triton_items.py          # list
    python benchmarks/triton_items.py --run    # run each, print its last lines
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRITON_TESTS = ["tests/test_triton_ops.py", "tests/test_triton_independent_kernel.py",
                "tests/test_triton_interpreter.py"]


@dataclass
class Item:
    name: str
    argv: list  # after `python -m pytest`
    interpret: bool  # TRITON_INTERPRET=1 for this run, else unset
    expect: str
    env: dict = field(default_factory=dict)

    def command(self):
        prefix = "TRITON_INTERPRET=1 " if self.interpret else ""
        return prefix + " ".join([sys.executable, "-m", "pytest", *self.argv])


def triton_items():
    """The GPU runs for the Triton ops, in the order to run them."""
    return [
        Item("native battery",
             [*TRITON_TESTS, "-q", "-p", "no:cacheprovider", "--autograd-devices=cuda", "-rs"],
             interpret=False,
             expect="all pass: the compiled kernels on CUDA (float64 gradcheck on the kernels' float64 path, "
                    "precision in float32, float16 and bfloat16); planted bugs still fail where asserted"),
        Item("interpreter on the GPU machine",
             ["tests/test_triton_ops.py", "-q", "-p", "no:cacheprovider", "--autograd-devices=cpu,cuda"],
             interpret=True,
             expect="all pass: the interpreter also takes CUDA tensors (it copies them to the host), so parity "
                    "compares a CUDA run against the CPU one"),
        Item("kernel timings",
             ["tests/test_triton_ops.py", "-q", "-p", "no:cacheprovider", "-k", "timings",
              "--autograd-devices=cuda", "--autograd-bench"],
             interpret=False,
             expect="a bench table: TritonRMSNorm against plain torch, 1024 and 8192 rows of 4096, forward, "
                    "backward and both; the ratio to the reference is the number to quote"),
        Item("tutorial page under the interpreter",
             ["tests/test_tutorial.py", "-q", "-p", "no:cacheprovider", "-k", "05-triton"],
             interpret=True,
             expect="passes (without TRITON_INTERPRET the page skips, saying why)"),
    ]


def run(item):
    env = dict(os.environ, **item.env)
    env.pop("TRITON_INTERPRET", None)
    if item.interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", *item.argv], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run the items instead of listing them")
    args = parser.parse_args(argv)
    failed = 0
    for item in triton_items():
        print(f"## {item.name}\n$ {item.command()}\nexpect: {item.expect}")
        if args.run:
            code, lines = run(item)
            failed += code != 0
            print(f"exit {code}\n" + "\n".join(lines[-25:]))
        print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
