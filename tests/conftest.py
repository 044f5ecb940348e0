"""Shared set-up for the test suite.

``pytester.runpytest_inprocess`` restores ``sys.modules`` after each run,
dropping every module first imported during it. torch's C extension cannot
be imported a second time in one process, so torch (and the modules the
generated test files use) are imported here, before any in-process run.
"""

import torch  # noqa: F401

import pytest_autograd.checks.gradcheck  # noqa: F401
import pytest_autograd.checks.gradgradcheck  # noqa: F401
import pytest_autograd.checks.parity  # noqa: F401
import pytest_autograd.checks.reference  # noqa: F401
import pytest_autograd.imperative  # noqa: F401
import pytest_autograd.runner  # noqa: F401
import reference_ops  # noqa: F401
import reference_ops.buggy  # noqa: F401

import pytest

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
