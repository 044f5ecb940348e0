"""The engine's one way of running work in other processes: a persistent worker that survives nothing but
reports everything (engine/processes)."""

import ctypes
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from pytest_autograd.engine.processes import Worker, transport


def pid():
    return os.getpid()


def segfault():
    ctypes.string_at(0)


def abort():
    os.abort()


def sleep(seconds):
    time.sleep(seconds)


def layout(tensor):
    return tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.requires_grad, tensor.is_leaf


def values(tensor):
    return tensor.detach().clone()


def raise_value_error():
    raise ValueError("no such size")


def call(function, *args):
    return function(*args)


@pytest.fixture
def worker():
    started = Worker("test")
    yield started
    started.stop()


def test_a_worker_keeps_one_process_between_tasks(worker):
    first, second = worker.run(pid).value, worker.run(pid).value
    assert first == second != os.getpid()
    assert worker.starts == 1


def test_a_segfault_is_a_crash_naming_the_signal_and_the_next_task_gets_a_new_process(worker):
    before = worker.run(pid).value
    outcome = worker.run(segfault)
    assert outcome.crash is not None and outcome.crash.signal_name == "SIGSEGV"
    assert "segfault" in outcome.crash.log  # faulthandler's stack of the crashed thread, from the child's log
    after = worker.run(pid)
    assert after.returned and after.value != before
    assert worker.starts == 2


def test_an_abort_is_a_crash_naming_sigabrt(worker):
    assert worker.run(abort).crash.signal_name == "SIGABRT"


def test_a_task_past_its_timeout_is_stopped_as_hung_and_the_worker_goes_on(worker):
    outcome = worker.run(sleep, 30, timeout=0.5)
    assert outcome.hung == 0.5 and not outcome.returned
    assert worker.run(pid).returned


def test_an_exception_comes_back_with_its_type_message_and_traceback(worker):
    raised = worker.run(raise_value_error).raised
    assert (raised.type_name, raised.message) == ("ValueError", "no such size")
    assert "raise_value_error" in raised.traceback_text


def test_tensors_cross_in_their_exact_layout(worker):
    base = torch.arange(40.0).reshape(4, 10)
    row_strided = base[:, 2:7]  # last stride 1, rows 10 apart, storage offset 2
    transposed = torch.randn(3, 5).t()
    leaf = torch.randn(2, 3, requires_grad=True)
    assert worker.run(layout, row_strided).value == ((4, 5), (10, 1), 2, False, True)
    assert worker.run(layout, transposed).value == ((5, 3), (1, 5), 0, False, True)
    assert worker.run(layout, leaf).value == ((2, 3), (3, 1), 0, True, True)
    assert torch.equal(worker.run(values, row_strided).value, row_strided)


def test_torch_operators_cross_by_name(worker):
    outcome = worker.run(call, torch.ops.aten.mul.Tensor, torch.ones(2), torch.full((2,), 3.0))
    assert torch.equal(outcome.value, torch.full((2,), 3.0))


def test_a_class_of_a_module_imported_from_its_file_alone_is_found_there_by_that_file(worker, tmp_path):
    (tmp_path / "only_by_path.py").write_text("class Doubler:\n    def __call__(self, x):\n        return 2 * x\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("only_by_path_module", tmp_path / "only_by_path.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["only_by_path_module"] = module  # as pytest's importlib mode registers a test module
    try:
        spec.loader.exec_module(module)
        assert worker.run(call, module.Doubler(), 21).value == 42
    finally:
        del sys.modules["only_by_path_module"]


def test_a_task_the_child_cannot_rebuild_says_so_and_never_ran(worker):
    local = type("Local", (), {})  # not importable anywhere
    with pytest.raises(Exception):
        transport.dumps(local)
    sys.modules["vanishing_module"] = type(sys)("vanishing_module")
    try:
        sys.modules["vanishing_module"].__dict__["Thing"] = type("Thing", (), {"__module__": "vanishing_module"})
        thing = sys.modules["vanishing_module"].Thing
        thing.__qualname__ = "Thing"
        outcome = worker.run(call, thing)
    finally:
        del sys.modules["vanishing_module"]
    assert outcome.unsent and "vanishing_module" in outcome.raised.message


def test_a_script_calling_run_checks_without_a_main_guard_is_not_run_again_in_the_sandbox(tmp_path):
    script = tmp_path / "check_it.py"
    script.write_text(textwrap.dedent("""
        import torch
        from pytest_autograd import run_checks
        from reference_ops.crashing import BoxPool

        print("script body ran", flush=True)
        boxes = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 6.0]])
        outcomes = run_checks(BoxPool, torch.randn(2, 4, 6), boxes, constants=("boxes",), checks=["sizes"])
        print([outcome.status for outcome in outcomes])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script body ran") == 1
    assert "['passed']" in done.stdout


def test_a_hung_task_says_where_it_waited(worker):
    outcome = worker.run(sleep, 30, timeout=1.0)
    assert outcome.hung == 1.0
    assert "in sleep" in outcome.crash.log  # faulthandler's stack, asked for before the child was stopped
