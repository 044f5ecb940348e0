"""Each test builds its samples under a seed from the base seed and its node id, and each item checks under its
own: reproducible, printed, rerunnable."""

import json
import re

import pytest

RECORDING_TEST = """
import json
import os
import pytest
import torch
from reference_ops import LinearFunction

def record(request, x):
    with open(os.environ["SAMPLES_LOG"], "a") as log:
        log.write(json.dumps([request.node.nodeid, x.flatten().tolist()]) + "\\n")

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_linear(request):
    x = torch.randn(2, 3)
    record(request, x)
    return [(x, torch.randn(2, 3), None)]

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_linear_again(request):
    x = torch.randn(2, 3)
    record(request, x)
    return [(x, torch.randn(2, 3), None)]
"""

FAILING_TEST = """
import pytest
import torch
from reference_ops.buggy import LinearGradInputWrong

@pytest.mark.autograd_op(op=LinearGradInputWrong)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]
"""


def logged(log):
    """(test, values) per call of a test body, in order: the test is the item's node id without its parameters."""
    return [(nodeid.split("[")[0], values) for nodeid, values in map(json.loads, log.read_text().splitlines())]


def recorded_samples(pytester, run_pytest, monkeypatch, *args):
    log = pytester.path / "samples.jsonl"
    if log.exists():
        log.unlink()
    monkeypatch.setenv("SAMPLES_LOG", str(log))
    run_pytest("--autograd-checks=gradcheck,reference", *args).assert_outcomes(passed=4)
    return dict(logged(log))


def test_each_test_gets_its_own_samples_which_every_item_of_it_gets_again(pytester, run_pytest, monkeypatch):
    pytester.makepyfile(test_seeded=RECORDING_TEST)
    log = pytester.path / "samples.jsonl"
    monkeypatch.setenv("SAMPLES_LOG", str(log))
    run_pytest("--autograd-checks=gradcheck,reference").assert_outcomes(passed=4)
    calls = logged(log)
    assert [test for test, _ in calls] == ["test_seeded.py::test_linear"] * 2 + ["test_seeded.py::test_linear_again"] * 2
    assert calls[0][1] == calls[1][1] and calls[2][1] == calls[3][1] and calls[0][1] != calls[2][1]


def test_the_same_base_seed_gives_the_same_samples(pytester, run_pytest, monkeypatch):
    pytester.makepyfile(test_seeded=RECORDING_TEST)
    first = recorded_samples(pytester, run_pytest, monkeypatch, "--autograd-seed=5")
    second = recorded_samples(pytester, run_pytest, monkeypatch, "--autograd-seed=5")
    other = recorded_samples(pytester, run_pytest, monkeypatch, "--autograd-seed=6")
    assert first == second
    assert all(first[nodeid] != other[nodeid] for nodeid in first)


def test_an_item_run_alone_sees_the_samples_it_saw_in_the_full_run(pytester, run_pytest, monkeypatch):
    pytester.makepyfile(test_seeded=RECORDING_TEST)
    full = recorded_samples(pytester, run_pytest, monkeypatch)
    log = pytester.path / "samples.jsonl"
    log.unlink()
    run_pytest("test_seeded.py::test_linear_again[reference-cpu]").assert_outcomes(passed=1)
    [(test, values)] = logged(log)
    assert values == full[test]


def test_the_seed_and_a_rerun_command_are_printed_on_failure(pytester, run_pytest):
    pytester.makepyfile(test_failing=FAILING_TEST)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-seed=42")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  seed: *",
        '  rerun: pytest "test_failing.py::test_linear[[]gradcheck-cpu[]]" --autograd-seed=42',
    ], consecutive=True)


def rerun_alone(run_pytest, first, item, *args):
    """The run of ``item`` alone by the rerun command ``first`` printed for it."""
    rerun = re.search(rf'rerun: pytest "([^"]+{re.escape(item)})" --autograd-seed=(\d+)', first.stdout.str())
    second = run_pytest(rerun.group(1), f"--autograd-seed={rerun.group(2)}", *args)
    second.assert_outcomes(failed=1)
    return second


def report_from(result, headline):
    """The failure report starting at ``headline``, up to its rerun line."""
    text = result.stdout.str()
    start = text.index(headline)
    return text[start:text.index("rerun:", start)]


def test_the_rerun_command_reproduces_the_same_failure(pytester, run_pytest):
    pytester.makepyfile(test_failing=FAILING_TEST)
    first = run_pytest("--autograd-checks=gradcheck", "--autograd-seed=42")
    first.assert_outcomes(failed=1)
    second = rerun_alone(run_pytest, first, "[gradcheck-cpu]")

    headline = "does not match the numerical derivative"
    assert report_from(second, headline) == report_from(first, headline)
    assert "worst element: d output[" in report_from(second, headline)


def test_a_random_base_seed_is_shown_in_the_header_and_in_the_rerun_command(pytester, run_pytest):
    pytester.makepyfile(test_failing=FAILING_TEST)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-seed=random")
    result.assert_outcomes(failed=1)
    seed = re.search(r"autograd: devices=cpu checks=gradcheck seed=(\d+)", result.stdout.str()).group(1)
    result.stdout.fnmatch_lines([f'  rerun: pytest "test_failing.py::test_linear[[]gradcheck-cpu[]]" '
                                 f"--autograd-seed={seed}"])


PYTHON_AND_NUMPY_SAMPLES = """
import json
import os
import random
import numpy
import pytest
import torch

@pytest.mark.autograd_op(op=torch.sin, checks=["gradcheck", "reference"], reference=torch.sin)
def test_sin(request):
    values = [random.random(), float(numpy.random.rand())]
    with open(os.environ["SAMPLES_LOG"], "a") as log:
        log.write(json.dumps([request.node.nodeid, values]) + "\\n")
    return (torch.tensor(values, dtype=torch.float64),)
"""


def test_samples_drawn_with_random_and_numpy_are_reproduced_by_the_seed(pytester, run_pytest, monkeypatch):
    pytest.importorskip("numpy")
    pytester.makepyfile(test_seeded=PYTHON_AND_NUMPY_SAMPLES)
    log = pytester.path / "samples.jsonl"
    monkeypatch.setenv("SAMPLES_LOG", str(log))
    run_pytest("--autograd-seed=3").assert_outcomes(passed=2)
    (test, full), second = logged(log)
    assert second == (test, full)  # each item calls the body, under the test's seed
    log.unlink()
    run_pytest("test_seeded.py::test_sin[reference-cpu]", "--autograd-seed=3").assert_outcomes(passed=1)
    assert logged(log) == [(test, full)]


def test_an_item_leaves_the_random_generators_as_it_found_them(pytester, run_pytest):
    pytest.importorskip("numpy")
    pytester.makepyfile(
        test_leak="""
        import random
        import numpy
        import pytest
        import torch

        random.seed(123)
        numpy.random.seed(123)
        torch.manual_seed(123)

        @pytest.mark.autograd_op(op=torch.sin, checks=["gradcheck", "reference"], reference=torch.sin)
        def test_sin():
            return (torch.randn(3, dtype=torch.float64) + random.random() + numpy.random.rand(),)

        def test_unmarked_test_after_it_sees_the_streams_it_seeded():
            assert random.random() == random.Random(123).random()
            assert numpy.random.rand() == numpy.random.RandomState(123).rand()
            assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(123)))
        """
    )
    run_pytest("-p", "no:randomly").assert_outcomes(passed=3)


def test_an_xdist_worker_uses_the_seed_its_controller_drew(pytester, run_pytest):
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_configure(config):
            config.workerinput = {"workerid": "gw0", "autograd_seed": 4242}  # what xdist gives a worker
        """
    )
    pytester.makepyfile(test_failing=FAILING_TEST)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-seed=random")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['  rerun: pytest "test_failing.py::test_linear[[]gradcheck-cpu[]]" --autograd-seed=4242'])


def test_the_xdist_controller_hands_its_random_seed_to_each_worker(pytester, run_pytest):
    pytester.makeconftest(
        """
        from types import SimpleNamespace

        def pytest_report_header(config):
            node = SimpleNamespace(config=config, workerinput={})
            config.pluginmanager.get_plugin("autograd").pytest_configure_node(node)
            return f"worker seed={node.workerinput['autograd_seed']}"
        """
    )
    result = run_pytest("--autograd-seed=random")
    header = re.search(r"autograd: devices=cpu checks=all seed=(\d+)", result.stdout.str()).group(1)
    result.stdout.fnmatch_lines([f"worker seed={header}"])


def test_an_item_rerun_alone_reports_what_it_reported_after_the_items_before_it(pytester, run_pytest):
    """What one item of a test learns about the op and hands the next (e.g. whether it runs in float64) never
    moves the next one's random draws: its rerun line reproduces the report of the full run."""
    pytester.makepyfile(test_failing=FAILING_TEST.replace("op=LinearGradInputWrong",
                                                          "op=LinearGradInputWrong, reference=torch.nn.functional.linear"))
    first = run_pytest("--autograd-checks=gradcheck,reference", "--autograd-seed=42", "--autograd-shrink=0")
    first.assert_outcomes(failed=2)
    second = rerun_alone(run_pytest, first, "[reference-cpu]", "--autograd-shrink=0")

    headline = "differs from the reference"
    assert report_from(second, headline) == report_from(first, headline)
    assert "worst element: grad input[" in report_from(second, headline)


FLOAT32_ONLY_TEST = """
import os
import pytest
import torch

class Float32Only(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.dtype == torch.float64:
            with open(os.environ["FLOAT64_LOG"], "a") as log:
                log.write("float64 call\\n")
            raise TypeError("this kernel supports float32 only")
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2

@pytest.mark.autograd_op(op=Float32Only, reference=lambda x: x * 2)
def test_float32_kernel():
    return [(torch.randn(4, 5),)]
"""


def test_the_items_of_one_test_ask_the_op_once_whether_it_runs_in_float64(pytester, run_pytest, monkeypatch):
    pytester.makepyfile(test_kernel=FLOAT32_ONLY_TEST)
    log = pytester.path / "float64.log"
    monkeypatch.setenv("FLOAT64_LOG", str(log))
    result = run_pytest("--autograd-checks=gradcheck,reference,grad_metadata,precision", "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    assert log.read_text().count("float64 call") == 1
