"""reusing_freed_memory: while a check runs on a large sample, a large tensor reuses the memory an earlier one freed
instead of fresh pages; after the op's last check that memory goes back; small samples, the user's own malloc
settings and the off switch leave glibc alone."""

import os
import platform
import resource
from types import SimpleNamespace

import pytest
import torch

from pytest_autograd.engine import freed_memory
from pytest_autograd.engine.case import OpCase, Sample
from pytest_autograd.engine.freed_memory import LARGE_SAMPLE, give_back

LARGE = 5 << 20  # float64 elements: 40 MiB, past the largest mmap threshold glibc ever sets by itself
PAGES = LARGE * 8 // resource.getpagesize()
SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
            "GLIBC_TUNABLES", freed_memory.SWITCH)

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or "THP_MEM_ALLOC_ENABLE" in os.environ,
    reason="glibc's malloc settings, torch's CPU tensors in base pages")


@pytest.fixture(autouse=True)
def glibc_as_the_plugin_finds_it(monkeypatch):
    """No malloc setting of the machine's, the environment read afresh, nothing kept from another test."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    lookup = freed_memory._glibc
    lookup.cache_clear()
    if lookup() is None:
        pytest.skip("another allocator than glibc's is preloaded")
    give_back()
    yield
    give_back()
    lookup.cache_clear()


BEHAVIOUR = """
import json, resource, sys, torch
from pytest_autograd.engine.freed_memory import LARGE_SAMPLE, give_back, reusing_freed_memory

LARGE = 5 << 20  # float64 elements: 40 MiB, past the largest mmap threshold glibc ever sets by itself

def pages_faulted_in(calls):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        x = torch.ones(LARGE, dtype=torch.float64)
        y = x * 2
        del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()

found = {"by_glibc": pages_faulted_in(8)}
with reusing_freed_memory(LARGE_SAMPLE):
    pages_faulted_in(4)
    found["reused"] = pages_faulted_in(8)
    held = [torch.ones(LARGE, dtype=torch.float64) for _ in range(6)]  # 240 MiB
    found["peak"] = resident()
    del held
found["kept"] = resident()
give_back()
found["given_back"] = resident()
json.dump(found, sys.stdout)
"""


def test_inside_large_tensors_reuse_freed_memory_which_goes_back_after_the_ops_last_check(tmp_path, monkeypatch):
    """In a fresh interpreter, where glibc's heap holds nothing an earlier test freed."""
    import json
    import subprocess
    import sys

    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "behaviour.py"
    script.write_text(BEHAVIOUR)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["by_glibc"] >= 8 * 2 * PAGES * 0.9  # glibc by itself faults both tensors in, every call
    assert found["reused"] < found["by_glibc"] / 4
    assert found["kept"] > found["peak"] - (100 << 20)  # kept for the op's next check
    assert found["given_back"] < found["peak"] - (200 << 20)


@pytest.mark.parametrize("setting", ["MALLOC_MMAP_MAX_=65536", "MALLOC_TRIM_THRESHOLD_=0",
                                     "GLIBC_TUNABLES=glibc.malloc.mmap_max=65536", "PYTEST_AUTOGRAD_MALLOPT=0",
                                     "PYTEST_AUTOGRAD_MALLOPT=off"])
def test_the_users_own_malloc_settings_or_the_off_switch_leave_glibc_alone(monkeypatch, setting):
    name, value = setting.split("=", 1)
    monkeypatch.setenv(name, value)
    freed_memory._glibc.cache_clear()
    assert freed_memory._glibc() is None


def test_an_unrelated_glibc_tunable_leaves_it_to_the_plugin(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
    freed_memory._glibc.cache_clear()
    assert freed_memory._glibc() is not None


@pytest.fixture
def glibc_calls(monkeypatch):
    """The mallopt and malloc_trim calls that reach glibc, by parameter (``trim`` for malloc_trim)."""
    calls = []

    class Recorder:
        def mallopt(self, parameter, value):
            calls.append(parameter)
            return 1

        def malloc_trim(self, pad):
            calls.append("trim")

    monkeypatch.setattr(freed_memory, "_glibc", lambda: Recorder())
    return calls


def item_on(device, *tensors):
    """What ``_judging_mode`` reads of an item: its device and its case's samples."""
    sample = Sample(*tensors, torch.zeros(3), None, bias=torch.zeros(2))
    return SimpleNamespace(device=device, case=OpCase(op=None, samples=[sample]))


def test_checks_on_a_large_sample_reuse_freed_memory_and_bench_runs_as_the_project_does(glibc_calls):
    from pytest_autograd.checks.bench import check as bench
    from pytest_autograd.checks.gradcheck import check as gradcheck
    from pytest_autograd.engine.running import _judging_mode

    with _judging_mode(bench, item_on("cpu", torch.zeros(LARGE_SAMPLE))):
        assert glibc_calls == []
    with _judging_mode(gradcheck, item_on("cpu", torch.zeros(LARGE_SAMPLE))):
        assert glibc_calls == [freed_memory.M_TRIM_THRESHOLD, freed_memory.M_MMAP_MAX]
    assert glibc_calls[2:] == [freed_memory.M_MMAP_MAX, freed_memory.M_MMAP_THRESHOLD, freed_memory.M_TRIM_THRESHOLD]


@pytest.mark.parametrize("item", ["small sample", "sparse sample", "item on a GPU"])
def test_checks_on_small_samples_or_on_a_gpu_never_touch_glibcs_settings(glibc_calls, item):
    from pytest_autograd.checks.gradcheck import check as gradcheck
    from pytest_autograd.engine.running import _judging_mode

    found = {"small sample": lambda: item_on("cpu", torch.zeros(LARGE_SAMPLE - 1)),
             "sparse sample": lambda: item_on("cpu", torch.sparse_coo_tensor(
                 torch.zeros(2, 1, dtype=torch.long), [1.0], (1 << 16, 1 << 16), check_invariants=True)),
             "item on a GPU": lambda: item_on("cuda", torch.zeros(LARGE_SAMPLE))}[item]()
    with _judging_mode(gradcheck, found):
        pass
    give_back()
    assert glibc_calls == []


def test_run_checks_gives_the_memory_back_once_after_its_last_check(glibc_calls, monkeypatch):
    from pytest_autograd import run_checks

    monkeypatch.setattr(freed_memory, "LARGE_SAMPLE", 8)
    outcomes = run_checks(lambda x: x * 2, torch.randn(8, dtype=torch.float64), checks=["gradcheck", "reentrancy"])
    assert [o.status for o in outcomes] == ["passed", "passed"]
    assert glibc_calls.count("trim") == 1 and glibc_calls[-1] == "trim"
    assert glibc_calls.count(freed_memory.M_MMAP_MAX) == 2 * 2 + 1  # set and settled by each check, settled again


def test_under_pytest_the_memory_goes_back_after_each_tests_last_item(pytester, run_pytest, glibc_calls,
                                                                     monkeypatch):
    monkeypatch.setattr(freed_memory, "LARGE_SAMPLE", 8)
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
    assert glibc_calls.count("trim") == 2
