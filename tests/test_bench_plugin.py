"""The bench check and the autograd_bench fixture as a user meets them, through pytester.

Budgets are tiny (the numbers are not the point here): these tests assert
what is run, skipped, printed, written and failed, never how fast.
"""

import json

import pytest

# Inner runs skip what makes each in-process run slow (see conftest.FAST_INNER_RUN); xdist stays
# loaded because the xdist tests need it.
BASE = ["-p", "no:cacheprovider", "--assert=plain", "-p", "no:unraisableexception", "-p", "no:hypothesispytest",
        "-p", "no:benchmark"]
FAST = [*BASE, "--autograd-checks=bench", "--autograd-bench-budget=0.01", "--autograd-bench-warmup=0.001"]

LINEAR_TEST = """
import pytest, torch
from reference_ops import LinearFunction

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_linear():
    x, w, b = torch.randn(8, 16), torch.randn(4, 16), torch.randn(4)
    return [(x, w, b), (x, w, None)]
"""


@pytest.fixture(autouse=True, scope="module")
def _flop_counter_loaded():
    """FlopCounterMode imports torch._dynamo on first use. pytester's in-process runs drop
    modules first imported inside them, and re-importing dynamo's operator libraries
    fails, so load them once out here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        torch.ones(2, 2) @ torch.ones(2, 2)


def run(pytester, *args):
    return pytester.runpytest_inprocess(*FAST, *args)


def test_bench_items_are_skipped_without_the_option_and_say_how_to_run_them(pytester):
    pytester.makepyfile(LINEAR_TEST)
    result = run(pytester, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*benchmarks are off: pass --autograd-bench to time this op*"])
    result.stdout.no_fnmatch_line("*autograd bench*")


def test_bench_times_forward_backward_and_both_against_the_reference(pytester):
    pytester.makepyfile(LINEAR_TEST)
    result = run(pytester, "--autograd-bench")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*autograd bench: budget 0.01 s per timing*",
        "*= autograd bench =*",
        "machine: * cores, torch's default * threads); GPU *; torch *; CUDA *",
        "test * impl * dir * device * dtype * median * IQR * noise * rounds * TFLOP/s * GB/s * speedup",
        "test_linear[[]bench-cpu[]] * LinearFunction * fwd * cpu * float32 *x",
        "test_linear[[]bench-cpu[]] * ref linear * fwd * cpu * float32 *",
        "test_linear[[]bench-cpu[]] * LinearFunction * bwd *",
        "test_linear[[]bench-cpu[]] * ref linear * bwd *",
        "test_linear[[]bench-cpu[]] * LinearFunction * fwd+bwd *",
        "test_linear[[]bench-cpu[]] * ref linear * fwd+bwd *",
        "CPU: wall clock around adaptive blocks of calls, * torch thread(s); caches warm",
        "speedup = reference median / op median*",
    ])


def test_bench_only_deselects_everything_else(pytester):
    pytester.makepyfile(LINEAR_TEST + """
def test_plain():
    pass
""")
    result = pytester.runpytest_inprocess(*BASE, "--autograd-checks=gradcheck,bench", "--autograd-bench-only",
                                          "--autograd-bench-budget=0.01", "--autograd-bench-warmup=0.001")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*test_linear[[]bench-cpu[]] * LinearFunction*"])


def test_json_follows_pytest_benchmarks_schema_with_roofline_extras(pytester):
    stats_fields = pytest.importorskip("pytest_benchmark.stats").Stats.fields
    pytester.makepyfile(test_lin=LINEAR_TEST)
    result = run(pytester, "--autograd-bench-json=out/bench.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["wrote 6 timing(s) to *bench.json"])
    doc = json.loads((pytester.path / "out" / "bench.json").read_text())
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert {"node", "machine", "python_version", "cpu", "torch", "cuda", "threads"} <= set(doc["machine_info"])
    assert len(doc["benchmarks"]) == 6
    entry = doc["benchmarks"][0]
    assert {"group", "name", "fullname", "params", "param", "extra_info", "options", "stats"} <= set(entry)
    assert set(stats_fields) | {"data", "iterations"} <= set(entry["stats"])
    assert entry["fullname"] == "test_lin.py::test_linear[bench-cpu]::op::forward::float32"
    extra = entry["extra_info"]
    assert extra["flops"] == 2 * 8 * 16 * 4  # counted on the reference: the matmul of linear
    assert extra["bytes"] > 0 and extra["tflops"] > 0 and extra["gbps"] > 0
    assert {"noise", "stop", "timer", "cache", "threads", "speedup"} <= set(extra)


def test_marker_flops_and_bytes_override_the_counts(pytester):
    pytester.makepyfile("""
import pytest, torch

@pytest.mark.autograd_op(op=torch.sin, flops={"forward": 1000, "backward": 3000}, bytes=lambda x: 2 * x.numel() * 4)
def test_sin():
    return [(torch.randn(64),)]
""")
    result = run(pytester, "--autograd-bench-json=bench.json")
    result.assert_outcomes(passed=1)
    entries = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    rows = {e["params"]["direction"]: e["extra_info"] for e in entries}
    assert rows["forward"]["flops"] == 1000 and rows["backward"]["flops"] == 3000
    assert rows["forward+backward"]["flops"] == 4000
    assert rows["forward"]["bytes"] == 512


def _baseline(pytester, name, median):
    """A hand-written baseline for test_lin.py: regression tests must not depend on real speed."""
    benchmarks = []
    for direction in ("forward", "backward", "forward+backward"):
        fullname = f"test_lin.py::test_linear[bench-cpu]::op::{direction}::float32"
        benchmarks.append({"fullname": fullname, "name": fullname, "group": "g", "params": {}, "param": "",
                           "extra_info": {}, "options": {},
                           "stats": {"data": [median * 0.99, median, median * 1.01], "iterations": 1}})
    folder = pytester.path / ".autograd_bench"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"machine_info": {}, "commit_info": {}, "benchmarks": benchmarks,
                                                      "datetime": "", "version": "5.1.0"}))


def test_a_regression_fails_the_bench_item_with_old_new_ratio_and_noise(pytester):
    pytester.makepyfile(test_lin=LINEAR_TEST)
    _baseline(pytester, "main", median=1e-9)  # nothing real runs in a nanosecond
    result = run(pytester, "--autograd-bench-compare=main", "--autograd-bench-fail=median:10%")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*3 timing(s) regressed against baseline 'main' (limit median +10%)",
        "*check bench, device cpu*",
        "*LinearFunction forward (cpu, float32): median old 1 ns -> new * ratio *x, limit median +10%; "
        "noise old *, new *",
        "*LinearFunction backward (cpu, float32): median old 1 ns*",
        "*hint: if the slowdown is expected, save a new baseline with --autograd-bench-save=main",
        "*vs main*",
        "*REGRESSED*",
    ])
    assert "Traceback" not in result.stdout.str()
    assert "def test_linear" not in result.stdout.str()


def test_a_run_within_the_limit_passes_and_shows_the_ratio(pytester):
    pytester.makepyfile(test_lin=LINEAR_TEST)
    _baseline(pytester, "main", median=1000.0)  # far slower than anything real
    result = run(pytester, "--autograd-bench-compare=main", "--autograd-bench-fail=median:10%")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*speedup * vs main", "*LinearFunction * fwd *0.00x"])


def test_a_missing_baseline_is_saved_with_a_note_not_an_error(pytester):
    pytester.makepyfile(LINEAR_TEST)
    result = run(pytester, "--autograd-bench-compare=nightly", "--autograd-bench-fail=median:10%")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["note: baseline 'nightly' did not exist; saved this run's 6 timing(s) to "
                                 "*nightly.json for the next comparison"])
    saved = json.loads((pytester.path / ".autograd_bench" / "nightly.json").read_text())
    assert len(saved["benchmarks"]) == 6
    again = run(pytester, "--autograd-bench-compare=nightly")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*vs nightly*"])
    again.stdout.no_fnmatch_line("*did not exist*")


def test_save_writes_a_json_baseline_under_autograd_bench(pytester):
    pytester.makepyfile(LINEAR_TEST)
    result = run(pytester, "--autograd-bench-save=main")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["saved 6 timing(s) as baseline 'main' (*main.json)"])
    assert json.loads((pytester.path / ".autograd_bench" / "main.json").read_text())["benchmarks"]


def test_a_corrupt_baseline_is_a_clean_usage_failure(pytester):
    pytester.makepyfile(LINEAR_TEST)
    (pytester.path / ".autograd_bench").mkdir()
    (pytester.path / ".autograd_bench" / "main.json").write_text("{not json")
    result = run(pytester, "--autograd-bench-compare=main")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*main.json is not valid JSON*delete it or save it again*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("option, message", [
    ("--autograd-bench-fail=median:10%", "*--autograd-bench-fail needs a baseline*--autograd-bench-compare=NAME*"),
    ("--autograd-bench-budget=soon", "*--autograd-bench-budget: 'soon' is not a number of seconds*"),
    ("--autograd-bench-save=../up", "*--autograd-bench-save: '../up' is not a baseline name*"),
    ("--autograd-bench-cache=lukewarm", "*'lukewarm' is not a cache mode*"),
])
def test_bad_options_are_usage_errors_naming_the_fix(pytester, option, message):
    pytester.makepyfile(LINEAR_TEST)
    result = pytester.runpytest_inprocess(*BASE, "--autograd-bench", option)
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


SWEEP_TEST = """
import pytest, torch
from reference_ops import LinearFunction

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear, sweep=[8, 16, 32],
                         bench_directions=["forward"])
def test_linear(size=4):
    return [(torch.randn(size, size), torch.randn(size, size), torch.randn(size))]
"""


def test_a_sweep_times_each_size_and_tabulates_against_size(pytester):
    pytester.makepyfile(SWEEP_TEST)
    result = run(pytester, "--autograd-bench")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "test * dtype * size * median*",
        "test_linear[[]bench-cpu[]] * LinearFunction * fwd * cpu * float32 * 8 *",
        "test_linear[[]bench-cpu[]] * ref linear * fwd * cpu * float32 * 8 *",
        "test_linear[[]bench-cpu[]] * LinearFunction * fwd * cpu * float32 * 16 *",
        "test_linear[[]bench-cpu[]] * LinearFunction * fwd * cpu * float32 * 32 *",
    ])
    result.stdout.no_fnmatch_line("test_linear* bwd *")


def test_a_sweep_plot_puts_op_and_reference_on_one_png(pytester):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(SWEEP_TEST)
    result = run(pytester, "--autograd-bench-plot=plots")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["wrote 1 plot(s) to *plots"])
    (png,) = (pytester.path / "plots").glob("*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_without_a_size_parameter_says_how_to_add_one(pytester):
    pytester.makepyfile("""
import pytest, torch

@pytest.mark.autograd_op(op=torch.sin, sweep=[8, 16])
def test_sin():
    return [(torch.randn(8),)]
""")
    result = run(pytester, "--autograd-bench")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*sweep= needs a test parameter with a default*def test_linear(size=256)*sweep_arg*"])
    assert "Traceback" not in result.stdout.str()


def test_sweep_arg_names_the_parameter(pytester):
    pytester.makepyfile("""
import pytest, torch

@pytest.mark.autograd_op(op=torch.sin, sweep=[8, 16], sweep_arg="n", bench_directions="forward")
def test_sin(scale=1.0, n=4):
    return [(scale * torch.randn(n),)]
""")
    result = run(pytester, "--autograd-bench-json=b.json")
    result.assert_outcomes(passed=1)
    sizes = [e["params"]["size"] for e in json.loads((pytester.path / "b.json").read_text())["benchmarks"]]
    assert sizes == [8, 16]


def test_in_place_ops_are_timed_on_clones_and_say_so(pytester):
    pytester.makepyfile("""
import pytest, torch
from reference_ops import AddOneInPlace

@pytest.mark.autograd_op(op=AddOneInPlace)
def test_add_one():
    return [(torch.randn(32),)]
""")
    result = run(pytester, "--autograd-bench")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*AddOneInPlace: includes cloning the inputs (the op writes to them in place)"])


def test_the_fixture_returns_stats_to_assert_on(pytester):
    pytester.makepyfile("""
import torch
from reference_ops import MyReLU

def test_relu(autograd_bench):
    x = torch.randn(256)
    result = autograd_bench(MyReLU.apply, x, reference=torch.relu, budget=0.01)
    assert result.forward.median > 0 and result.forward.rounds >= 3
    assert result.backward.noise >= 0 and result.forward_backward.iqr >= 0
    assert result.speedup("forward") > 0
    assert result.reference.name == "torch.relu" and result.op.name == "MyReLU.apply"
    assert {row["direction"] for row in result.rows} == {"forward", "backward", "forward+backward"}
""")
    result = pytester.runpytest_inprocess(*BASE, "--autograd-bench", "--autograd-bench-warmup=0.001")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_relu::MyReLU.apply * MyReLU.apply * fwd *"])


def test_the_fixture_skips_without_the_option(pytester):
    pytester.makepyfile("""
def test_relu(autograd_bench):
    raise AssertionError("must not run")
""")
    result = pytester.runpytest_inprocess(*BASE, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*pass --autograd-bench to run autograd_bench*"])


def test_the_fixture_fails_a_regression_without_a_traceback(pytester):
    pytester.makepyfile(test_fix="""
import torch

def test_relu(autograd_bench):
    autograd_bench(torch.relu, torch.randn(64), name="relu", budget=0.01)
""")
    folder = pytester.path / ".autograd_bench"
    folder.mkdir()
    entries = [{"fullname": f"test_fix.py::test_relu::relu::op::{d}::float32",
                "stats": {"data": [1e-9, 1e-9, 1e-9], "iterations": 1}} for d in ("forward", "backward")]
    (folder / "main.json").write_text(json.dumps({"benchmarks": entries}))
    result = pytester.runpytest_inprocess(*BASE, "--autograd-bench-compare=main",
                                          "--autograd-bench-fail=median:10%", "--autograd-bench-warmup=0.001")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*relu: 2 timing(s) regressed against baseline 'main' (limit median +10%)",
                                 "*forward (cpu, float32): median old 1 ns -> new *"])
    assert "Traceback" not in result.stdout.str()


def test_xdist_workers_report_into_one_summary_and_json(pytester):
    pytest.importorskip("xdist")
    # flops= given in full: workers skip the FLOP counter, whose first use imports torch._dynamo.
    pytester.makepyfile(LINEAR_TEST.replace("reference=", "flops={'forward': 1, 'backward': 2}, reference=") + """
@pytest.mark.autograd_op(op=torch.sin)
def test_sin():
    return [(torch.randn(16),)]

def test_plain():
    pass
""")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", *BASE, "--autograd-checks=gradcheck,bench",
                                           "--autograd-bench", "--autograd-bench-budget=0.01",
                                           "--autograd-bench-warmup=0.001", "--autograd-bench-json=b.json")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*= autograd bench =*", "*test_linear[[]bench-cpu[]] * LinearFunction*",
                                 "*test_sin[[]bench-cpu[]] *sin*", "wrote 9 timing(s) to *b.json"])
    tests = {e["fullname"].split("::")[1] for e in json.loads((pytester.path / "b.json").read_text())["benchmarks"]}
    assert tests == {"test_linear[bench-cpu]", "test_sin[bench-cpu]"}  # no xdist '@group' suffix


def test_bench_items_get_one_xdist_group_per_device(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(LINEAR_TEST)
    items, _ = pytester.inline_genitems(*BASE, "--autograd-checks=gradcheck,bench",
                                        "--autograd-bench")
    groups = {item.name: [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert groups == {"test_linear[gradcheck-cpu]": [], "test_linear[bench-cpu]": ["autograd-bench-cpu"]}


def test_help_lists_the_bench_options(pytester):
    result = pytester.runpytest_inprocess(*BASE, "--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--autograd-bench *run the bench items*", "*--autograd-bench-noise=FRACTION*",
                                 "*--autograd-bench-fail=EXPR*", "*median:10% or min:0.001*"])


def test_the_bench_plugin_imports_no_torch_when_no_benchmark_runs(pytester):
    pytester.makepyfile("""
import sys

def test_plain():
    assert "torch" not in sys.modules
""")
    result = pytester.runpytest_subprocess(*BASE, "-p", "no:xdist", "--autograd-bench")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["autograd bench: budget 0.5 s per timing, noise target 3.0%*; CPU * cores)"])
