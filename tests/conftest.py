"""Shared set-up for the test suite.

``pytester.runpytest_inprocess`` restores ``sys.modules`` after each run,
dropping every module first imported during it. torch's C extension cannot
be imported a second time in one process, and re-importing the check
modules (or sympy, which torch.autograd.grad pulls in) on every run costs
about a second each, so they are all imported here, before any run.
"""

import importlib

import pytest
import torch
import torch.fx.experimental.symbolic_shapes  # noqa: F401  (torch.autograd.grad imports it, and sympy, on first use)

import pytest_autograd.imperative  # noqa: F401
import pytest_autograd.runner  # noqa: F401
import reference_ops  # noqa: F401
import reference_ops.buggy  # noqa: F401
from pytest_autograd.builtin import builtin_check_names

for _name in builtin_check_names():
    importlib.import_module(f"pytest_autograd.checks.{_name}")

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
