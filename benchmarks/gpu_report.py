"""Validate everything CUDA in one command and write a markdown report.

    python benchmarks/gpu_report.py --out gpu-report.md

On a machine with CUDA this runs, in about 5-10 minutes, each step of
:data:`STEPS` and lists it as passed, failed or skipped, with its reason and
its figures:

1. the extension's CUDA build (``reference_ops.extension``);
2. the extension's tests (``tests/test_extension.py``, CUDA tests included);
3. the battery on the shipped ops with ``--autograd-devices=cpu,cuda``;
4. parity on CUDA for the shipped ops (from the battery's run);
5. parity on a planted CUDA-only bug (``reference_ops.buggy_cuda``), which must fail;
6. precision in float16 and bfloat16 on CUDA, per op;
7. the bench timer against ``triton.testing.do_bench`` on the same ops (ratio per op);
8. the extension's linear forward+backward against cuBLAS (``F.linear``) at
   4096^3 in float32 with TF32 off, and 9. in bfloat16;
10. the Triton RMSNorm's tests with compiled kernels;
11. on a machine with several GPUs, pytest-xdist with one worker per GPU: each
    worker's ``cuda`` items must run on its own GPU;
12. the whole test suite under pytest-xdist: tests that a GPU machine runs
    differently (no Triton interpreter, real CUDA items) show there.

Without CUDA it says there is nothing to validate and exits 0. The exit
status is 1 when a step failed, else 0. Steps that would start after the
time budget (``--budget``, default 570 s) are skipped, saying so.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
STATUSES = ("passed", "failed", "skipped")


# ---------------------------------------------------------------------------
# Steps and their results
# ---------------------------------------------------------------------------


@dataclass
class StepResult:
    """What one step found: a status, a one-line reason, figures (table rows) and output for failures."""

    status: str
    reason: str
    figures: list = field(default_factory=list)  # list of dicts, column -> value, all with the same keys
    details: str = ""
    name: str = ""
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")


def passed(reason, figures=(), details=""):
    return StepResult("passed", reason, list(figures), details)


def failed(reason, figures=(), details=""):
    return StepResult("failed", reason, list(figures), details)


def skipped(reason, figures=(), details=""):
    return StepResult("skipped", reason, list(figures), details)


@dataclass
class Step:
    """A named check of the report: ``run(context) -> StepResult``, given at most ``budget`` seconds."""

    name: str
    run: Callable[["Context"], StepResult]
    budget: float


@dataclass
class Context:
    """What the steps share: where to write, the time left, and results later steps read."""

    workdir: Path
    deadline: float
    shared: dict = field(default_factory=dict)

    def time_left(self):
        return self.deadline - time.monotonic()


def run_steps(steps, context):
    """Run every step in order; one that raises is failed, one past the deadline skipped. Never raises."""
    results = []
    for step in steps:
        start = time.monotonic()
        if context.time_left() <= 0:
            result = skipped("the report's time budget was spent before this step (raise --budget)")
        else:
            try:
                result = step.run(context)
            except Exception as exc:  # noqa: BLE001 - a broken step is reported, the others still run
                result = failed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
                                details=traceback.format_exc()[-4000:])
        result.name, result.seconds = step.name, time.monotonic() - start
        results.append(result)
        print(f"[{result.status:>7}] {step.name} ({result.seconds:.0f}s): {result.reason}", flush=True)
    return results


# ---------------------------------------------------------------------------
# The markdown report
# ---------------------------------------------------------------------------


def _cell(value):
    if isinstance(value, float):
        value = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows):
    """Rows of dicts (same keys) as a markdown table; empty string for no rows."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(_cell(row.get(column, "")) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def count_statuses(results):
    return {status: sum(result.status == status for result in results) for status in STATUSES}


def render_report(results, machine, seconds):
    """The whole report: a header, one summary table, then a section per step."""
    counts = count_statuses(results)
    verdict = "FAILED" if counts["failed"] else "PASSED"
    out = ["# GPU validation report", ""]
    out += [f"- {key}: {value}" for key, value in machine.items()]
    out += [f"- result: **{verdict}**: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped in {seconds:.0f} s", ""]
    out.append(markdown_table([{"step": result.name, "status": result.status, "seconds": f"{result.seconds:.1f}",
                                "reason": result.reason} for result in results]))
    for result in results:
        out += ["", f"## {result.name}", "", f"**{result.status}**: {result.reason}"]
        if result.figures:
            out += ["", markdown_table(result.figures)]
        if result.details:
            out += ["", "<details><summary>output</summary>", "", "```text", result.details.rstrip(), "```", "",
                    "</details>"]
    return "\n".join(out) + "\n"


def machine_description():
    import torch

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if torch.cuda.is_available():
        info["GPU"] = f"{torch.cuda.get_device_name()} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))})"
    info["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})" if torch.version.cuda else torch.__version__
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    info["Python"] = platform.python_version()
    return info


# ---------------------------------------------------------------------------
# Running pytest and reading its junit XML
# ---------------------------------------------------------------------------


@dataclass
class ItemOutcome:
    name: str  # e.g. "tests/test_battery.py::test_linear[parity-cuda]"
    status: str  # passed / failed / skipped
    message: str = ""

    @property
    def check_and_device(self):
        """("parity", "cuda") for an autograd item ``test_x[parity-cuda]``; (None, None) otherwise."""
        found = re.search(r"\[([\w-]+?)-(cpu|cuda(?::\d+)?|mps|xpu)\]$", self.name)
        return (found.group(1), found.group(2)) if found else (None, None)


def read_junit(path):
    """One ItemOutcome per test case of a junit XML file (errors count as failures)."""
    outcomes = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, message = "failed", child.get("message", "") or (child.text or "")
                break
            if child.tag == "skipped":
                status, message = "skipped", child.get("message", "")
        outcomes.append(ItemOutcome(name, status, message))
    return outcomes


def tally(outcomes):
    return {status: sum(o.status == status for o in outcomes) for status in STATUSES}


def plugin_installed():
    """Whether the plugin is installed (a ``pytest11`` entry point), so every pytest run loads it by itself."""
    from importlib import metadata

    try:
        points = metadata.entry_points(group="pytest11")
    except TypeError:  # Python < 3.10
        points = metadata.entry_points().get("pytest11", [])
    return any(point.value == "pytest_autograd.plugin" for point in points)


def pytest_environment():
    """The checkout first on the path and, where the plugin is not installed, ``PYTEST_PLUGINS`` naming it.

    ``-p pytest_autograd.plugin`` would load it in the outer run only: the tests' own in-process pytest runs
    (pytester) read the environment, not the outer command line, and would run without the plugin.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if not plugin_installed():
        env["PYTEST_PLUGINS"] = ",".join(filter(None, [os.environ.get("PYTEST_PLUGINS"), "pytest_autograd.plugin"]))
    return env


def run_pytest(context, label, arguments, budget, cwd=ROOT):
    """Run pytest in a subprocess with the checkout's plugin; (returncode, outcomes, output tail)."""
    junit = context.workdir / f"{label}.xml"
    command = [sys.executable, "-m", "pytest", *arguments, "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    timeout = max(10.0, min(budget, context.time_left()))
    try:
        done = subprocess.run(command, cwd=cwd, env=pytest_environment(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"")[-3000:]
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        why = REPORT_BUDGET_SPENT if timeout < budget else "its step's budget"
        return None, [], f"stopped after {timeout:.0f} s, at {why}\n{output}"
    outcomes = read_junit(junit) if junit.exists() else []
    return done.returncode, outcomes, (done.stdout + done.stderr)[-4000:]


REPORT_BUDGET_SPENT = "the report's time budget (raise --budget)"


def no_results(output):
    """The step's result when its pytest run gave no outcomes: skipped when the report's budget stopped it (not
    a verdict on the code), else failed."""
    first = output.splitlines()[0] if output else "pytest produced no results"
    if REPORT_BUDGET_SPENT in first:
        return skipped(first, details=output)
    return failed(first if first.startswith("stopped after") else "pytest produced no results", details=output)


def _summary(outcomes):
    counts = tally(outcomes)
    return ", ".join(f"{counts[status]} {status}" for status in STATUSES)


def _failed_names(outcomes, limit=5):
    names = [o.name.split("::")[-1] for o in outcomes if o.status == "failed"]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------


def step_extension_build(context):
    import warnings

    import torch
    from torch.utils import cpp_extension

    from reference_ops import extension

    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extension.load_extension()
    seconds = time.monotonic() - start
    figures = [{"CUDA_HOME": cpp_extension.CUDA_HOME or "not found", "torch CUDA": torch.version.cuda,
                "build + load (s)": round(seconds, 1)}]
    if not extension.cuda_extension_available():
        why = "; ".join(str(w.message) for w in caught) or "the operators have no CUDA kernel"
        return failed(f"the CUDA kernels were not built: {why}", figures)
    return passed("C++ and CUDA kernels built (or reused from torch's extension cache) and loaded", figures)


def step_extension_tests(context):
    code, outcomes, output = run_pytest(context, "extension", ["tests/test_extension.py"], budget=240)
    if not outcomes:
        return no_results(output)
    cuda = [o for o in outcomes if "cuda" in o.name.lower()]
    figures = [{"tests": "all", **tally(outcomes)}, {"tests": "CUDA only", **tally(cuda)}]
    if any(o.status == "failed" for o in outcomes):
        return failed(f"{_failed_names(outcomes)} failed", figures, output)
    if not any(o.status == "passed" for o in cuda):
        return failed("no CUDA test ran: " + (cuda[0].message if cuda else "none collected"), figures, output)
    return passed(_summary(outcomes), figures)


def step_battery(context):
    code, outcomes, output = run_pytest(context, "battery", ["tests/test_battery.py", "--autograd-devices=cpu,cuda"],
                                        budget=300)
    context.shared["battery"] = outcomes
    if not outcomes:
        return no_results(output)
    figures = []
    for check in sorted({o.check_and_device[0] for o in outcomes} - {None}):
        row = {"check": check}
        for device in ("cpu", "cuda"):
            row[device] = _summary([o for o in outcomes if o.check_and_device == (check, device)])
        figures.append(row)
    if any(o.status == "failed" for o in outcomes):
        return failed(f"{_failed_names(outcomes)} failed", figures, output)
    return passed(_summary(outcomes), figures)


def step_parity_shipped(context):
    outcomes = context.shared.get("battery")
    if not outcomes:
        return skipped("the battery step gave no results to read parity from")
    parity = [o for o in outcomes if o.check_and_device == ("parity", "cuda")]
    figures = [{"op": o.name.split("::")[-1].split("[")[0], "parity on cuda": o.status,
                "note": o.message[:120]} for o in parity]
    if not parity:
        return failed("the battery has no parity-cuda items", figures)
    if any(o.status == "failed" for o in parity):
        return failed(f"{_failed_names(parity)} failed", figures)
    if not any(o.status == "passed" for o in parity):
        return failed("every parity-cuda item was skipped: " + parity[0].message, figures)
    return passed(f"every output and gradient on CUDA matches CPU: {_summary(parity)}", figures)


PLANTED_BUG_TEST = '''
import pytest, torch, torch.nn.functional as F
from reference_ops import LinearFunction
from reference_ops.buggy_cuda import LinearTailDroppedOnCuda

def samples():
    return [(torch.randn(6, 11), torch.randn(5, 11), torch.randn(5))]

@pytest.mark.autograd_op(op=LinearTailDroppedOnCuda, reference=F.linear, checks=["parity"])
def test_planted_bug():
    return samples()

@pytest.mark.autograd_op(op=LinearFunction, reference=F.linear, checks=["parity"])
def test_correct_twin():
    return samples()
'''


def step_parity_planted_bug(context):
    folder = context.workdir / "planted_bug"
    folder.mkdir(exist_ok=True)
    (folder / "test_planted_bug.py").write_text(PLANTED_BUG_TEST)
    code, outcomes, output = run_pytest(context, "planted_bug", ["test_planted_bug.py", "--autograd-devices=cpu,cuda"],
                                        budget=120, cwd=folder)
    by_name = {o.name.split("::")[-1]: o for o in outcomes}
    bug, twin = by_name.get("test_planted_bug[parity-cuda]"), by_name.get("test_correct_twin[parity-cuda]")
    figures = [{"op": name, "parity on cuda": o.status if o else "missing", "message": (o.message if o else "")[:160]}
               for name, o in (("LinearTailDroppedOnCuda (planted bug)", bug), ("LinearFunction (correct twin)", twin))]
    if bug is None or twin is None:
        return failed("the parity-cuda items were not both collected", figures, output)
    if bug.status != "failed":
        return failed(f"the planted CUDA-only bug was not caught: parity {bug.status}", figures, output)
    if "from cuda differs from cpu" not in bug.message + output:
        return failed("parity failed, but not with its differs-from-cpu report", figures, output)
    if twin.status != "passed":
        return failed(f"the correct twin did not pass: parity {twin.status}", figures, output)
    lines = [line for line in output.splitlines() if "differs from cpu" in line or "worst element" in line]
    return passed("parity caught the planted CUDA-only bug and passed its correct twin", figures, "\n".join(lines[:4]))


def _precision_test_file():
    return textwrap.dedent('''
        import pytest, torch
        from reference_ops import EXAMPLES, ExtLinearFunction, extension_available

        LOW = ["float16", "bfloat16"]

        def _marked(name, example):
            @pytest.mark.autograd_op(op=example.function, reference=example.reference, checks=["precision"], dtypes=LOW)
            def test(autograd_device):
                return example.samples(generator=torch.Generator().manual_seed(0))
            test.__name__ = "test_" + name
            return test

        for _name, _example in EXAMPLES.items():
            globals()["test_" + _name] = _marked(_name, _example)

        if extension_available():
            @pytest.mark.autograd_op(op=ExtLinearFunction, reference=torch.nn.functional.linear,
                                     checks=["precision"], dtypes=LOW)
            def test_ext_linear_function(autograd_device):
                g = torch.Generator().manual_seed(0)
                return [(torch.randn(64, 96, generator=g), torch.randn(80, 96, generator=g) / 10, torch.randn(80, generator=g))]
    ''')


def step_precision_low(context):
    folder = context.workdir / "precision"
    folder.mkdir(exist_ok=True)
    (folder / "test_precision_low.py").write_text(_precision_test_file())
    code, outcomes, output = run_pytest(context, "precision", ["test_precision_low.py", "--autograd-devices=cuda"],
                                        budget=180, cwd=folder)
    if not outcomes:
        return no_results(output)
    figures = [{"op": o.name.split("::")[-1].split("[")[0], "float16 + bfloat16": o.status, "note": o.message[:160]}
               for o in outcomes]
    if any(o.status == "failed" for o in outcomes):
        return failed(f"{_failed_names(outcomes)} failed", figures, output)
    if not any(o.status == "passed" for o in outcomes):
        return failed("no precision item ran on CUDA", figures, output)
    return passed(_summary(outcomes), figures)


TIMER_AGREEMENT = 1.5  # ratios outside [1/1.5, 1.5] mean the two timers measure different things


def step_timer_vs_do_bench(context):
    try:
        import triton.testing  # noqa: F401
    except ImportError:
        return skipped("triton is not installed (pip install triton)")
    import torch

    sys.path.insert(0, str(BENCHMARKS))
    import bench_timer_vs_do_bench as comparison
    from pytest_autograd.bench.config import TimerConfig
    from pytest_autograd.bench.timers import measure
    from reference_ops import extension

    ops = [(name, *comparison.make_op(name, 4096, torch.float16)[:1]) for name in sorted(comparison.OPS)]
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    ops.append(("ext_linear (float32)", lambda: extension.ext_linear(a, b)))
    figures, off = [], []
    for name, fn in ops:
        ours = measure(fn, "cuda", TimerConfig(budget=1.0, cache="cold"))
        theirs, note = comparison.time_do_bench(fn)
        ratio = ours.median / theirs
        figures.append({"op": name, "pytest-autograd (ms)": ours.median * 1e3, "do_bench (ms)": theirs * 1e3,
                        "ratio": round(ratio, 3), "IQR/median": f"{ours.noise:.1%}"})
        if not 1 / TIMER_AGREEMENT <= ratio <= TIMER_AGREEMENT:
            off.append(f"{name} ({ratio:.2f}x)")
    if off:
        return failed(f"the timers disagree by more than {TIMER_AGREEMENT}x on {', '.join(off)}", figures)
    return passed("pytest-autograd's CUDA timer (cold L2) against do_bench, ratio = ours / do_bench "
                  "(ops of benchmarks/bench_timer_vs_do_bench.py at n=4096 float16, plus the extension)", figures)


def _linear_vs_cublas(context, dtype_name):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(BENCHMARKS))
    import bench_extension
    from reference_ops import extension

    dtype = getattr(torch, dtype_name)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        n = 4096
        torch.manual_seed(0)
        x = torch.randn(n, n, device="cuda", dtype=dtype)
        w = torch.randn(n, n, device="cuda", dtype=dtype) / n ** 0.5
        got, expected = extension.ext_linear(x, w), F.linear(x.double(), w.double())
        error = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        tolerance = {torch.float32: 1e-4, torch.bfloat16: 4e-2}[dtype]
        rows = bench_extension.bench_size(n, "cuda", dtype, warmup=3, iters=10)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    figures = [{"pass": name, "ext (ms)": ext_ms, "cuBLAS (ms)": torch_ms, "ext / cuBLAS": round(ext_ms / torch_ms, 2),
                "ext TFLOP/s": round(flops / (ext_ms * 1e-3) / 1e12, 1)} for name, ext_ms, torch_ms, flops in rows]
    if error > tolerance:
        return failed(f"the extension's output differs from float64 F.linear: relative error {error:.3g} > {tolerance}",
                      figures)
    both = next(row for row in figures if row["pass"] == "fwd+bwd")
    return passed(f"forward+backward at {n}^3 {dtype_name}{' (TF32 off)' if dtype == torch.float32 else ''}: "
                  f"{both['ext / cuBLAS']}x cuBLAS's time; output within {error:.2g} of float64", figures)


def step_linear_vs_cublas_float32(context):
    return _linear_vs_cublas(context, "float32")


def step_linear_vs_cublas_bfloat16(context):
    import torch

    if not torch.cuda.is_bf16_supported():
        return skipped(f"{torch.cuda.get_device_name()} has no bfloat16 support")
    return _linear_vs_cublas(context, "bfloat16")


def step_triton_native(context):
    """The Triton RMSNorm's tests with compiled kernels on CUDA: the first run of benchmarks/triton_items.py."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return skipped("triton is not installed (pip install -e '.[triton]')")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return skipped("TRITON_INTERPRET=1 is set: unset it so the kernels are compiled for the GPU")
    sys.path.insert(0, str(BENCHMARKS))
    from triton_items import triton_items

    native = triton_items()[0]
    code, outcomes, output = run_pytest(context, "triton-native", native.argv, budget=240)
    if not outcomes:
        return no_results(output)
    figures = [{"tests": "Triton, native on CUDA", **tally(outcomes)}]
    if any(o.status == "failed" for o in outcomes):
        return failed(f"{_failed_names(outcomes)} failed", figures, output)
    if not any(o.status == "passed" for o in outcomes):
        return failed("no Triton test ran on CUDA", figures, output)
    return passed(_summary(outcomes), figures)


WORKER_GPUS_TEST = '''
import os, pytest, torch
from reference_ops import MyReLU


class RecordsItsDevice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with open(f"devices-{os.environ.get('PYTEST_XDIST_WORKER', 'serial')}.txt", "a") as seen:
            seen.write(f"{x.device}\\n")
        return MyReLU.apply(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


@pytest.mark.parametrize("n", range({items}))
@pytest.mark.autograd_op(op=lambda x: RecordsItsDevice.apply(x), checks=["parity"])
def test_device(n):
    return [(torch.tensor([1.0, 2.0, 3.0]),)]
'''


def step_worker_gpus(context):
    """pytest-xdist with one worker per GPU: worker gwN must run its bare ``cuda`` items on cuda:N."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        return skipped(f"one GPU here ({torch.cuda.get_device_name()}): nothing to spread over workers")
    if importlib_util_find_spec("xdist") is None:
        return skipped("pytest-xdist is not installed (pip install pytest-xdist)")
    folder = context.workdir / "worker_gpus"
    folder.mkdir(exist_ok=True)
    (folder / "test_worker_gpus.py").write_text(WORKER_GPUS_TEST.replace("{items}", str(4 * count)))
    code, outcomes, output = run_pytest(context, "worker_gpus", ["test_worker_gpus.py", "--autograd-devices=cpu,cuda",
                                                                 "-n", str(count)], budget=180, cwd=folder)
    seen = {path.stem.split("-", 1)[1]: set(path.read_text().split()) - {"cpu"}
            for path in folder.glob("devices-*.txt")}
    figures = [{"worker": worker, "CUDA devices its items ran on": ", ".join(sorted(devices))}
               for worker, devices in sorted(seen.items())]
    wrong = [f"{worker} ran on {sorted(devices)}" for worker, devices in seen.items()
             if worker.startswith("gw") and devices != {f"cuda:{int(worker[2:]) % count}"}]
    if not seen or any(o.status == "failed" for o in outcomes):
        return failed("the items did not all pass, or recorded no device", figures, output)
    if wrong:
        return failed("workers did not get their own GPU: " + "; ".join(wrong), figures, output)
    return passed(f"{len(seen)} workers, each on its own GPU of {count}", figures)


def importlib_util_find_spec(name):
    import importlib.util

    return importlib.util.find_spec(name)


# The report, in order. EXTENSION POINT: to validate another CUDA op, write a
# ``step_...(context) -> StepResult`` (return passed/failed/skipped(reason,
# figures)) and append a Step here; run_pytest() runs a generated test file.
def step_whole_suite(context):
    """``pytest tests`` with one xdist worker per two cores: what a GPU machine runs differently shows here."""
    import importlib.util

    if importlib.util.find_spec("xdist") is None:
        return skipped("pytest-xdist is not installed: the suite alone would outlast the report")
    workers = max(2, (os.cpu_count() or 4) - 2)
    code, outcomes, output = run_pytest(context, "suite", ["tests", "-n", str(workers), "-rfE"], budget=330)
    if not outcomes:
        return no_results(output)
    figures = [{"tests": "all", **tally(outcomes)}]
    if any(o.status == "failed" for o in outcomes):
        return failed(f"{_failed_names(outcomes)} failed", figures, output)
    return passed(_summary(outcomes), figures)


STEPS = [
    Step("extension: CUDA build", step_extension_build, budget=240),
    Step("extension: tests", step_extension_tests, budget=240),
    Step("battery: cpu,cuda", step_battery, budget=300),
    Step("parity: shipped ops", step_parity_shipped, budget=5),
    Step("parity: planted CUDA-only bug must fail", step_parity_planted_bug, budget=120),
    Step("precision: float16 and bfloat16", step_precision_low, budget=180),
    Step("bench timer vs triton do_bench", step_timer_vs_do_bench, budget=90),
    Step("linear vs cuBLAS: 4096^3 float32, TF32 off", step_linear_vs_cublas_float32, budget=60),
    Step("linear vs cuBLAS: 4096^3 bfloat16", step_linear_vs_cublas_bfloat16, budget=60),
    Step("Triton RMSNorm: compiled kernels on CUDA", step_triton_native, budget=240),
    Step("xdist: one GPU per worker", step_worker_gpus, budget=180),
    Step("the whole test suite on the GPU machine", step_whole_suite, budget=330),
]


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def nothing_to_validate():
    """None where CUDA is usable, else the sentence saying why there is nothing to do."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"no CUDA device here (torch {torch.__version__}, {build}): "
            "nothing to validate; run this on a machine with a GPU")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="markdown report to write (default: print it only)")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for the whole report (default 570)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the checkout's reference_ops and pytest_autograd first

    reason = nothing_to_validate()
    if reason:
        print(reason)
        if args.out:
            args.out.write_text(f"# GPU validation report\n\n{reason}\n")
        return 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_report_") as workdir:
        context = Context(Path(workdir), deadline=start + args.budget)
        results = run_steps(STEPS, context)
    report = render_report(results, machine_description(), time.monotonic() - start)
    if args.out:
        args.out.write_text(report)
        print(f"report written to {args.out}")
    else:
        print(report)
    return 1 if count_statuses(results)["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
