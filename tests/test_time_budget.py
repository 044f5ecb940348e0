"""Every item runs under a time budget: an op that never returns fails its item, naming where it was."""

import threading
import time

import pytest

from pytest_autograd.engine.budget import call_with_limit
from pytest_autograd.pytest_adapter.timeout import parse_seconds

OPS = """
import time

import pytest
import torch


def spins_forever(x):
    y = x * 2
    while True:
        y = y + 0
    return y


def sleeps_forever(x):
    while True:
        time.sleep(0.05)


@pytest.mark.autograd_op(op={op}, checks=["gradcheck"])
def test_op():
    return (torch.randn(3),)


@pytest.mark.autograd_op(op=torch.sin, checks=["gradcheck"])
def test_after():
    return (torch.randn(3),)
"""


def test_an_op_that_loops_forever_fails_naming_its_frame_and_the_session_goes_on(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS.format(op="spins_forever"))
    result = run_pytest("--autograd-timeout=0.5")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "the item ran past its time budget of 0.5 s and was stopped",
        "*check gradcheck, device cpu, sample 0",
        "*stopped in the op's code at *test_ops.py:* in spins_forever",
        "*the check was at *gradcheck.py:* in run",
        "*stack at the limit (innermost last):",
        "*hint: the op may not terminate on these samples*--autograd-timeout=SECONDS (ini autograd_timeout; "
        "0 disables the limit)*",
        "*rerun: pytest *test_op[[]gradcheck-cpu[]]*",
    ])


def test_an_op_sleeping_in_short_calls_is_stopped_between_them(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS.format(op="sleeps_forever"))
    result = run_pytest("--autograd-timeout=0.5")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*stopped in the op's code at *test_ops.py:* in sleeps_forever"])


def test_the_ini_twin_sets_the_budget(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS.format(op="spins_forever"))
    pytester.makeini("[pytest]\nautograd_timeout = 0.5\n")
    run_pytest().stdout.fnmatch_lines(["the item ran past its time budget of 0.5 s and was stopped"])


def test_the_autograd_check_fixture_runs_under_the_same_budget(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
        import torch

        def spins_forever(x):
            while True:
                pass

        def test_imperative(autograd_check):
            autograd_check(spins_forever, torch.randn(3), checks=["gradcheck"])
    """)
    result = run_pytest("--autograd-timeout=0.5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the item ran past its time budget of 0.5 s*", "*in spins_forever"])


@pytest.mark.parametrize("option", ["--autograd-timeout=soon", "--autograd-timeout=-1"])
def test_a_budget_that_is_not_a_number_of_seconds_is_a_usage_error(pytester, run_pytest, option):
    pytester.makepyfile(test_ops=OPS.format(op="spins_forever"))
    result = run_pytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --autograd-timeout: * is not a number of seconds; pass e.g. "
                                 "--autograd-timeout=120 *, or 0 to run items without a time limit"])


def test_zero_disables_the_budget(pytester, run_pytest):
    assert parse_seconds("0") is None and parse_seconds(60) == 60.0
    pytester.makepyfile(test_ops=OPS.format(op="torch.cos"))
    run_pytest("--autograd-timeout=0").assert_outcomes(passed=2)


def _spin(seconds=30.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "finished"


def test_a_call_in_time_returns_its_value_and_leaves_nothing_pending():
    assert call_with_limit(5, lambda: 42).value == 42
    assert call_with_limit(0.3, lambda: _spin(0.2)).expired is None
    time.sleep(0.5)  # a deadline that fired late must not raise here


def test_nested_budgets_stop_only_the_inner_call_when_it_runs_out_first():
    inner = []
    outer = call_with_limit(10, lambda: inner.append(call_with_limit(0.3, _spin)) or "outer went on")
    assert outer.value == "outer went on" and outer.expired is None
    assert inner[0].expired is not None
    assert [frame.name for frame in inner[0].expired.frames][-1] == "_spin"


def test_a_budget_works_in_a_thread_other_than_the_main_one():
    found = []
    worker = threading.Thread(target=lambda: found.append(call_with_limit(0.3, _spin)))
    worker.start()
    worker.join(10)
    assert found and found[0].expired is not None


EXPIRIES_IN_BOOKKEEPING = """
import time
from pytest_autograd.engine.budget import call_with_limit

def registers_budgets_all_the_time():
    while True:
        call_with_limit(100, lambda: None)

for _ in range(12):  # each expiry lands somewhere in the inner budgets' own bookkeeping
    assert call_with_limit(0.05, registers_budgets_all_the_time).expired is not None

def spin():
    while True:
        pass

start = time.monotonic()
assert call_with_limit(0.3, spin).expired is not None
time.sleep(0.3)
print(f"stopped after {time.monotonic() - start:.1f} s, nothing pending")
"""


def test_budgets_still_stop_code_after_expiries_that_landed_in_their_own_bookkeeping():
    # An expiry raised while a nested budget held a lock once left the watchdog waiting on it for good: every
    # later budget of the session was dead, and a solver that never returns ran until memory ran out.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", EXPIRIES_IN_BOOKKEEPING], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("s, nothing pending\n"), done.stdout


def test_a_budget_nested_inside_another_ends_with_it_even_when_its_own_removal_never_ran():
    from pytest_autograd.engine.budget import _WATCHDOG, _Deadline

    left_behind = []

    def registers_without_removing():
        left_behind.append(_Deadline(0.2, threading.get_ident()))
        _WATCHDOG.add(left_behind[0])  # as when an expiry cuts an inner call_with_limit short before its cleanup
        return "done"

    assert call_with_limit(10, registers_without_removing).value == "done"
    left_behind = left_behind[0]
    assert not left_behind.active and left_behind not in _WATCHDOG.deadlines
    time.sleep(0.6)  # it must not fire here, outside the code it guarded
