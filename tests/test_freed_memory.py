"""reusing_freed_memory: while a check runs, a large tensor reuses the memory an earlier one freed instead of a fresh
mapping faulted in page by page; after it, glibc maps large blocks again; the user's own malloc settings stay."""

import os
import platform
import resource

import pytest
import torch

from pytest_autograd.engine import freed_memory
from pytest_autograd.engine.freed_memory import reusing_freed_memory

LARGE = 5 << 20  # float64 elements: 40 MiB, past the largest mmap threshold glibc ever sets by itself

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or "THP_MEM_ALLOC_ENABLE" in os.environ,
    reason="glibc's malloc settings, torch's CPU tensors in 4 KiB pages")


@pytest.fixture(autouse=True)
def fresh_lookup():
    """Each test reads the environment afresh, and leaves no answer of its own behind."""
    lookup = freed_memory._mallopt
    lookup.cache_clear()
    yield
    lookup.cache_clear()


PAGES = LARGE * 8 // 4096


def pages_faulted_in(calls):
    """Minor page faults of each of ``calls`` calls making and freeing two large tensors."""
    counts = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = torch.ones(LARGE, dtype=torch.float64)
        y = x * 2
        del x, y
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return counts


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def test_inside_large_tensors_reuse_the_memory_earlier_ones_freed():
    with reusing_freed_memory():
        counts = pages_faulted_in(calls=12)
    freed_memory.give_back()
    assert sum(counts[4:]) < 8 * 2 * PAGES // 4, counts  # a quarter of what a fresh mapping for each costs


def test_the_memory_kept_for_the_ops_next_check_goes_back_to_the_system_when_given_back():
    with reusing_freed_memory():
        held = [torch.ones(LARGE, dtype=torch.float64) for _ in range(6)]  # 240 MiB
        peak = resident_bytes()
        del held
    assert resident_bytes() > peak - (100 << 20)  # kept for the op's next check
    freed_memory.give_back()
    assert resident_bytes() < peak - (200 << 20)


@pytest.mark.parametrize("setting", ["MALLOC_MMAP_MAX_=65536", "MALLOC_TRIM_THRESHOLD_=0",
                                     "GLIBC_TUNABLES=glibc.malloc.mmap_max=65536", "PYTEST_AUTOGRAD_KEEP_MALLOC=1"])
def test_the_users_own_malloc_settings_or_the_off_switch_leave_glibc_alone(monkeypatch, setting):
    name, value = setting.split("=", 1)
    monkeypatch.setenv(name, value)
    assert freed_memory._mallopt() is None


def test_an_unrelated_glibc_tunable_leaves_it_to_the_plugin(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
    assert freed_memory._mallopt() is not None


def test_checks_that_judge_the_op_reuse_freed_memory_and_bench_runs_as_the_project_does(monkeypatch):
    from pytest_autograd.checks.bench import check as bench
    from pytest_autograd.checks.gradcheck import check as gradcheck
    from pytest_autograd.engine.running import _judging_mode

    calls = []
    monkeypatch.setattr(freed_memory, "_mallopt", lambda: lambda parameter, value: calls.append(parameter))
    with _judging_mode(bench):
        assert calls == []
    with _judging_mode(gradcheck):
        assert calls == [freed_memory.M_TRIM_THRESHOLD, freed_memory.M_MMAP_MAX]
    assert calls[2:] == [freed_memory.M_MMAP_MAX, freed_memory.M_MMAP_THRESHOLD, freed_memory.M_TRIM_THRESHOLD]


@pytest.fixture
def trims(monkeypatch):
    """The give-backs that reach glibc's malloc_trim."""
    calls = []
    monkeypatch.setattr(freed_memory, "_malloc_trim", lambda: lambda pad: calls.append(pad))
    return calls


def test_run_checks_gives_the_memory_back_once_after_its_last_check(trims, monkeypatch):
    from pytest_autograd import run_checks

    seen = []
    monkeypatch.setattr(freed_memory, "give_back", lambda original=freed_memory.give_back: (seen.append(1), original()))
    outcomes = run_checks(lambda x: x * 2, torch.randn(8, dtype=torch.float64), checks=["gradcheck", "reentrancy"])
    assert [o.status for o in outcomes] == ["passed", "passed"]
    assert (seen, trims) == ([1], [0])


def test_under_pytest_the_memory_goes_back_after_each_tests_last_item(pytester, run_pytest, trims):
    pytester.makepyfile("""
        import pytest, torch

        @pytest.mark.autograd_op(op=lambda x: x * 2, checks=["gradcheck", "reentrancy"])
        def test_double():
            return [(torch.randn(8, dtype=torch.float64),)]

        @pytest.mark.autograd_op(op=lambda x: x * 3, checks=["gradcheck", "reentrancy"])
        def test_triple():
            return [(torch.randn(8, dtype=torch.float64),)]

        def test_plain():
            pass
    """)
    result = run_pytest("-p", "no:randomly")
    result.assert_outcomes(passed=5)
    assert trims == [0, 0]
