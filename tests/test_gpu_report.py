"""benchmarks/gpu_report.py: what it says without CUDA, and the report it writes.

The steps themselves need a GPU; here the report writer and the step runner
get synthetic steps, and the pytest plumbing (subprocess, junit XML, item
names) runs for real on the planted-bug step, which must not pass on CPU.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_report.py"


@pytest.fixture(scope="module")
def gpu_report():
    spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_report"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_report", None)


def test_without_cuda_it_says_there_is_nothing_to_validate_and_exits_0(tmp_path):
    out = tmp_path / "report.md"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a machine that has one
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device here (torch " in done.stdout
    assert "nothing to validate; run this on a machine with a GPU" in done.stdout
    assert out.read_text().startswith("# GPU validation report\n\nno CUDA device here")


def synthetic_results(gpu_report):
    results = [
        gpu_report.passed("C++ and CUDA kernels built", [{"CUDA_HOME": "/usr/local/cuda", "build + load (s)": 41.5}]),
        gpu_report.failed("test_linear[parity-cuda] failed", [{"op": "test_linear", "parity on cuda": "failed"}],
                          details="gradient w.r.t. `weight` from cuda differs from cpu"),
        gpu_report.skipped("triton is not installed (pip install triton)"),
    ]
    for result, name, seconds in zip(results, ["extension: CUDA build", "parity: shipped ops", "timer | do_bench"],
                                      [41.5, 3.25, 0.0]):
        result.name, result.seconds = name, seconds
    return results


def test_the_report_lists_every_step_with_status_reason_and_figures(gpu_report):
    report = gpu_report.render_report(synthetic_results(gpu_report), {"GPU": "Fake GPU", "torch": "2.x"}, 44.8)
    lines = report.splitlines()
    assert lines[0] == "# GPU validation report"
    assert "- GPU: Fake GPU" in lines and "- torch: 2.x" in lines
    assert "- result: **FAILED**: 1 passed, 1 failed, 1 skipped in 45 s" in lines
    summary = lines.index("| step | status | seconds | reason |")
    assert lines[summary + 1] == "| --- | --- | --- | --- |"
    assert lines[summary + 2:summary + 5] == [
        "| extension: CUDA build | passed | 41.5 | C++ and CUDA kernels built |",
        "| parity: shipped ops | failed | 3.2 | test_linear[parity-cuda] failed |",
        "| timer \\| do_bench | skipped | 0.0 | triton is not installed (pip install triton) |",
    ]
    sections = [line for line in lines if line.startswith("## ")]
    assert sections == ["## extension: CUDA build", "## parity: shipped ops", "## timer | do_bench"]
    assert "| CUDA_HOME | build + load (s) |" in lines and "| /usr/local/cuda | 41.5 |" in lines
    assert "**failed**: test_linear[parity-cuda] failed" in lines
    details = lines.index("<details><summary>output</summary>")
    assert lines[details + 2:details + 5] == ["```text", "gradient w.r.t. `weight` from cuda differs from cpu", "```"]


def test_a_report_with_no_failure_says_passed(gpu_report):
    results = [result for result in synthetic_results(gpu_report) if result.status != "failed"]
    assert "- result: **PASSED**: 1 passed, 0 failed, 1 skipped in 1 s" in gpu_report.render_report(results, {}, 1.0)


def test_a_step_that_raises_fails_alone_and_steps_past_the_budget_are_skipped(gpu_report, tmp_path, capsys):
    def broken(context):
        raise RuntimeError("nvcc exploded\nsecond line")

    steps = [
        gpu_report.Step("broken", broken, budget=1),
        gpu_report.Step("fine", lambda context: gpu_report.passed("ok"), budget=1),
        gpu_report.Step("slow", lambda context: context.shared.update(late=True) or gpu_report.passed("late"), budget=1),
    ]
    context = gpu_report.Context(tmp_path, deadline=float("inf"))
    results = gpu_report.run_steps(steps[:2], context)
    assert [(r.name, r.status, r.reason) for r in results] == [("broken", "failed", "RuntimeError: nvcc exploded"),
                                                               ("fine", "passed", "ok")]
    assert "nvcc exploded" in results[0].details
    context.deadline = 0  # the budget is spent
    (late,) = gpu_report.run_steps(steps[2:], context)
    assert late.status == "skipped" and "time budget was spent" in late.reason and "late" not in context.shared
    assert "[ failed] broken" in capsys.readouterr().out


def test_a_step_result_refuses_an_unknown_status(gpu_report):
    with pytest.raises(ValueError, match="status must be one of"):
        gpu_report.StepResult("green", "looks fine")


def test_the_steps_list_covers_the_validation_and_is_the_extension_point(gpu_report):
    names = [step.name for step in gpu_report.STEPS]
    for expected in ("extension: CUDA build", "extension: tests", "battery: cpu,cuda", "parity: shipped ops",
                     "parity: planted CUDA-only bug must fail", "precision: float16 and bfloat16",
                     "bench timer vs triton do_bench", "linear vs cuBLAS: 4096^3 float32, TF32 off",
                     "linear vs cuBLAS: 4096^3 bfloat16", "the whole test suite on the GPU machine"):
        assert expected in names
    assert "EXTENSION POINT" in SCRIPT.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_the_planted_bug_step_never_passes_without_cuda(gpu_report, tmp_path):
    """The real pytest run, junit XML and item names: on CPU the cuda items skip, so the step must fail."""
    context = gpu_report.Context(tmp_path, deadline=float("inf"))
    result = gpu_report.step_parity_planted_bug(context)
    assert result.status == "failed"
    assert result.reason == "the planted CUDA-only bug was not caught: parity skipped"
    assert [row["parity on cuda"] for row in result.figures] == ["skipped", "skipped"]
    assert "CUDA is not available" in result.figures[0]["message"]


def test_the_report_names_the_plugin_in_the_environment_when_it_is_not_installed(gpu_report, monkeypatch):
    """``-p`` would reach the outer pytest only; the tests' in-process pytester runs read PYTEST_PLUGINS."""
    monkeypatch.delenv("PYTEST_PLUGINS", raising=False)
    monkeypatch.setattr(gpu_report, "plugin_installed", lambda: False)
    assert gpu_report.pytest_environment()["PYTEST_PLUGINS"] == "pytest_autograd.plugin"
    monkeypatch.setattr(gpu_report, "plugin_installed", lambda: True)
    assert "PYTEST_PLUGINS" not in gpu_report.pytest_environment()


def test_a_step_stopped_by_the_reports_budget_is_skipped_and_one_stopped_by_its_own_is_failed(gpu_report):
    spent = gpu_report.no_results(f"stopped after 43 s, at {gpu_report.REPORT_BUDGET_SPENT}\n.s..")
    assert (spent.status, spent.reason) == ("skipped", "stopped after 43 s, at the report's time budget (raise "
                                                       "--budget)")
    hung = gpu_report.no_results("stopped after 240 s, at its step's budget\n.s..")
    assert (hung.status, hung.reason) == ("failed", "stopped after 240 s, at its step's budget")
    assert gpu_report.no_results("collection error").status == "failed"
