"""Many GPUs under pytest-xdist: each worker's bare ``cuda`` items run on its own GPU, reports and rerun lines
name it, and an explicit ``cuda:1`` stays cuda:1. Without GPUs this is simulated: the worker's GPU count is
faked and a check reports the device it was given."""

import re

import pytest

from pytest_autograd.engine.devices import physical_gpu, worker_device


@pytest.mark.parametrize("device, worker, count, expected", [
    ("cuda", 0, 8, "cuda:0"),
    ("cuda", 5, 8, "cuda:5"),
    ("cuda", 9, 8, "cuda:1"),  # more workers than GPUs: round robin
    ("cuda", 3, 1, "cuda"),  # one GPU: nothing to spread
    ("cuda", None, 8, "cuda"),  # a serial run
    ("cuda:1", 0, 8, "cuda:1"),  # what the user wrote stays
    ("cpu", 2, 8, "cpu"),
])
def test_a_worker_gets_its_own_gpu_for_a_bare_cuda(device, worker, count, expected):
    assert worker_device(device, worker, count) == expected


def test_the_physical_gpu_follows_cuda_visible_devices():
    assert physical_gpu(1) == "1"
    assert physical_gpu(1, "4,5") == "5"
    assert physical_gpu(0, "GPU-abc,GPU-def") == "GPU-abc"


CONFTEST = """
from pytest_autograd import Check
from pytest_autograd.pytest_adapter import items

items.gpu_count = lambda: 2  # every worker sees two GPUs
_real_problem = items.device_problem
items.device_problem = lambda device: None if device.startswith("cuda") else _real_problem(device)


class WhereAmI(Check):
    name = "where"
    description = "fails saying the device it was given"

    def run(self, context):
        context.fail(f"ran on {context.device}")


def pytest_autograd_register_checks(registry):
    registry.add(WhereAmI())
"""

TESTS = """
import pytest, torch
from reference_ops import MyReLU

def samples():
    return [(torch.tensor([-1.0, 2.0]),)]

@pytest.mark.parametrize("n", range(6))
@pytest.mark.autograd_op(op=MyReLU, checks=["where"], devices=["cuda"])
def test_bare_cuda(n):
    return samples()

@pytest.mark.autograd_op(op=MyReLU, checks=["where"], devices=["cuda:1"])
def test_explicit_index():
    return samples()
"""


def failures_by_worker(output):
    """(test id, worker, device it ran on, rerun line) of each failure section of an xdist run."""
    return re.findall(r"_{3,} (\S+) _{3,}\n\[(gw\d+)\][^\n]*\nran on (\S+)\n(?:.*\n)*?  rerun: ([^\n]+)", output)


def test_xdist_workers_spread_bare_cuda_items_over_the_gpus_and_rerun_lines_pin_the_gpu(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_ops=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(failed=7)
    found = failures_by_worker(result.stdout.str())
    assert len(found) == 7, result.stdout.str()
    for test, worker, device, rerun in found:
        if test == "test_explicit_index[where-cuda:1]":
            assert device == "cuda:1" and "CUDA_VISIBLE_DEVICES" not in rerun
            continue
        index = int(worker[2:]) % 2
        assert device == f"cuda:{index}", (test, worker, device)
        assert rerun.startswith(f"CUDA_VISIBLE_DEVICES={4 + index} pytest "), rerun
        assert rerun.endswith("--autograd-devices=cuda"), rerun
    assert {worker for _, worker, _, _ in found} == {"gw0", "gw1"}


LOADGROUP_IGNORED = pytest.version_tuple >= (9, 2)  # xdist renames items through Node._nodeid, which 9.2 ignores


@pytest.mark.skipif(LOADGROUP_IGNORED, reason="pytest-xdist's --dist loadgroup groups nothing under pytest 9.2 "
                                              "(CI runs this test on pytest 8)")
def test_under_loadgroup_all_items_of_a_test_run_on_one_worker_and_rerun_lines_keep_the_plain_node_id(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_ops="""
import os, pytest, torch
from reference_ops import MyReLU
from reference_ops.buggy import ReLUPositiveGradOnly

@pytest.mark.parametrize("n", range(4))
@pytest.mark.autograd_op(op=MyReLU, checks=["gradcheck", "reference", "mutation"], reference=torch.relu)
def test_relu(n):
    with open(f"worker-{os.environ['PYTEST_XDIST_WORKER']}.txt", "a") as seen:
        seen.write(f"{n}\\n")
    return [(torch.tensor([-1.0, 2.0]),)]

@pytest.mark.autograd_op(op=ReLUPositiveGradOnly, checks=["gradcheck"])
def test_wrong():
    return [(torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]]),)]
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=12, failed=1)
    workers = {}
    for record in pytester.path.glob("worker-*.txt"):
        for n in record.read_text().split():
            workers.setdefault(n, set()).add(record.name)
    assert len(workers) == 4 and all(len(names) == 1 for names in workers.values()), workers
    result.stdout.fnmatch_lines(['  rerun: pytest "test_ops.py::test_wrong[[]gradcheck-cpu[]]" --autograd-seed=0'])
