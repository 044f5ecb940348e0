"""Shared set-up for the test suite.

``pytester.runpytest_inprocess`` restores ``sys.modules`` after each run,
dropping every module first imported during it. torch's C extension cannot
be imported a second time in one process, and re-importing the check
modules (or sympy, which torch.autograd.grad pulls in) on every run costs
about a second each, so they are all imported here, before any run.
"""

import importlib
import os

import pytest
import torch
from _pytest import pytester as pytester_module
import torch.fx.experimental.symbolic_shapes  # noqa: F401  (torch.autograd.grad imports it, and sympy, on first use)

import pytest_autograd.engine.api  # noqa: F401
import pytest_autograd.engine.running  # noqa: F401
import pytest_autograd.pytest_adapter.items  # noqa: F401
import pytest_autograd.pytest_adapter.fixtures  # noqa: F401
import reference_ops  # noqa: F401
import reference_ops.buggy  # noqa: F401
from pytest_autograd.engine.builtin import builtin_check_names

# Without a GPU, Triton kernels run on CPU tensors in Triton's interpreter. It is
# read when triton is first imported (torch._dynamo imports it), so it is
# switched on here, before anything can; a GPU runs the same tests natively.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

for _name in builtin_check_names():
    importlib.import_module(f"pytest_autograd.checks.{_name}")

# Modules that hold process-wide registries must survive pytester's restore
# of sys.modules: torch's compile stack registers kernel templates and
# custom ops once per process ("duplicate template name" on re-import), and
# a custom op defined in a pytester run is registered with torch for good.
_PERSISTENT_PREFIXES = ("torch", "sympy", "triton", "functorch", "pytest_autograd", "reference_ops")
_original_snapshot = getattr(pytester_module.Pytester, "_Pytester__take_sys_modules_snapshot", None)


def _snapshot_keeping_registries(self):
    snapshot = _original_snapshot(self)
    keep_default = getattr(snapshot, "_SysModulesSnapshot__preserve", None) or (lambda name: False)
    snapshot._SysModulesSnapshot__preserve = lambda name: keep_default(name) or name.startswith(_PERSISTENT_PREFIXES)
    return snapshot


if _original_snapshot is not None:  # a private pytester detail: without it, tests still run, only slower
    pytester_module.Pytester._Pytester__take_sys_modules_snapshot = _snapshot_keeping_registries

# Flags for in-process pytester runs: no cache files, no assertion rewriting
# (with PYTHONDONTWRITEBYTECODE every rewritten module is compiled again on
# each run), and no plugins that make each run slow (pytest's
# unraisable-exception check runs gc.collect() five times, ~0.5 s per run
# once torch is loaded) or that are noise here.
FAST_INNER_RUN = (
    "-p", "no:cacheprovider",
    "--assert=plain",
    "-p", "no:unraisableexception",
    "-p", "no:hypothesispytest",
    "-p", "no:benchmark",
    "-p", "no:xdist",
)


@pytest.fixture
def run_pytest(pytester):
    """``run_pytest(*args)``: run pytest in-process in the pytester directory, quickly."""

    def run(*args):
        return pytester.runpytest_inprocess(*FAST_INNER_RUN, *args)

    return run


@pytest.fixture(autouse=True)
def _inner_runs_are_not_ci_runs(monkeypatch):
    """pytest prints whole failure messages in its short summary when ``CI`` is set; the inner runs
    these tests read must look the same on a developer's machine and in CI."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
