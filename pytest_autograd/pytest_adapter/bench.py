"""pytest side of the benchmarks: options, collection, the fixture, the summary and files.

Imports no torch at module level: without ``--autograd-bench`` nothing
here costs more than parsing a few options. Rows reach the one summary
through report ``user_properties``, so xdist workers and a plain run behave
the same; only the controller writes JSON, baselines and plots.
"""

import json
from pathlib import Path

import pytest

from pytest_autograd.bench import config as bench_config
from pytest_autograd.bench.config import BadSetting, TimerConfig
from pytest_autograd.bench.state import (  # noqa: F401
    GROUP_PREFIX,
    OFF_REASON,
    PROPERTY,
    BenchState,
    stable_nodeid,
)

STATE = pytest.StashKey()


def state_of(config):
    return None if config is None else config.stash.get(STATE, None)


def bench_enabled(config):
    state = state_of(config)
    return bool(state and state.enabled)


OPTIONS = [
    ("--autograd-bench", dict(action="store_true", default=False,
                              help="run the bench items of autograd_op tests (skipped otherwise) and the "
                                   "autograd_bench fixture")),
    ("--autograd-bench-only", dict(action="store_true", default=False,
                                   help="run only benchmarks (implies --autograd-bench)")),
    ("--autograd-bench-budget", dict(default=None, metavar="SECONDS",
                                     help=f"time spent measuring each timing at most "
                                          f"(default {bench_config.DEFAULT_BUDGET})")),
    ("--autograd-bench-noise", dict(default=None, metavar="FRACTION",
                                    help=f"stop a timing once IQR/median is below this, e.g. 0.03 or 3%% "
                                         f"(default {bench_config.DEFAULT_NOISE:g})")),
    ("--autograd-bench-warmup", dict(default=None, metavar="SECONDS",
                                     help=f"untimed warm-up after the first call "
                                          f"(default {bench_config.DEFAULT_WARMUP})")),
    ("--autograd-bench-cache", dict(default=None, metavar="cold|warm",
                                    help="CUDA: flush L2 before each call (cold, default) or not (warm)")),
    ("--autograd-bench-threads", dict(default=None, metavar="N",
                                      help="CPU: torch threads while timing (default: torch's own setting; "
                                           "1 is steadiest on a busy machine)")),
    ("--autograd-bench-json", dict(default=None, metavar="PATH",
                                   help="write the timings as pytest-benchmark JSON (implies --autograd-bench)")),
    ("--autograd-bench-save", dict(default=None, metavar="NAME",
                                   help="save the timings as baseline NAME in .autograd_bench/ "
                                        "(implies --autograd-bench)")),
    ("--autograd-bench-compare", dict(default=None, metavar="NAME",
                                      help="compare with baseline NAME; a missing one is saved "
                                           "(implies --autograd-bench)")),
    ("--autograd-bench-fail", dict(default=None, metavar="EXPR",
                                   help="fail a bench item that regressed against the compared baseline, "
                                        "e.g. median:10%% or min:0.001 (seconds)")),
    ("--autograd-bench-plot", dict(default=None, metavar="DIR",
                                   help="write a PNG per swept op to DIR (needs matplotlib; "
                                        "implies --autograd-bench)")),
]


def pytest_addoption(parser):
    group = parser.getgroup("autograd", "autograd op checks (pytest-autograd)")
    for name, kwargs in OPTIONS:
        group.addoption(name, dest=name.lstrip("-").replace("-", "_"), **kwargs)


def _option(config, name):
    return config.getoption(name, None)


def _build_state(config):
    invoked = Path(config.invocation_params.dir)
    state = BenchState(root=Path(config.rootpath))
    state.only = bool(_option(config, "autograd_bench_only"))
    json_path, plot_dir = _option(config, "autograd_bench_json"), _option(config, "autograd_bench_plot")
    save, compare = _option(config, "autograd_bench_save"), _option(config, "autograd_bench_compare")
    fail = _option(config, "autograd_bench_fail")
    state.enabled = bool(_option(config, "autograd_bench") or state.only or json_path or plot_dir or save or compare)
    budget, noise = _option(config, "autograd_bench_budget"), _option(config, "autograd_bench_noise")
    warmup, cache = _option(config, "autograd_bench_warmup"), _option(config, "autograd_bench_cache")
    changes = {}
    if budget is not None:
        changes["budget"] = bench_config.parse_seconds(budget, "--autograd-bench-budget")
    if noise is not None:
        changes["noise"] = bench_config.parse_fraction(noise, "--autograd-bench-noise")
    if warmup is not None:
        changes["warmup"] = bench_config.parse_seconds(warmup, "--autograd-bench-warmup")
    if cache is not None:
        changes["cache"] = bench_config.parse_cache(cache, "--autograd-bench-cache")
    threads = _option(config, "autograd_bench_threads")
    if threads is not None:
        changes["threads"] = bench_config.parse_threads(threads, "--autograd-bench-threads")
    timer = TimerConfig(**changes)
    state.timer = timer
    if json_path:
        state.json_path = invoked / json_path
    if plot_dir:
        state.plot_dir = invoked / plot_dir
    if save:
        state.save = bench_config.parse_baseline_name(save, "--autograd-bench-save")
    if compare:
        state.compare = bench_config.parse_baseline_name(compare, "--autograd-bench-compare")
    if fail:
        if not compare:
            raise BadSetting("--autograd-bench-fail needs a baseline to compare with: "
                             "add --autograd-bench-compare=NAME")
        state.fail_rules = bench_config.parse_fail(fail)
    return state


def pytest_configure(config):
    try:
        state = _build_state(config)
    except BadSetting as problem:
        raise pytest.UsageError(str(problem)) from None
    config.stash[STATE] = state
    config.pluginmanager.register(BenchSession(config, state), "autograd-bench-session")


def pytest_report_header(config):
    state = state_of(config)
    if not state or not state.enabled:
        return None
    from pytest_autograd.bench.measure_info import cpu_count, cpu_name

    timer = state.timer
    threads = f", {timer.threads} CPU thread(s)" if timer.threads else ""
    # No torch here: the controller of an xdist run never needs it. The bench section
    # at the end names torch, CUDA, the GPU and the threads, as measured by the workers.
    return [f"autograd bench: budget {timer.budget:g} s per timing, noise target {timer.noise:.1%}, "
            f"warm-up {timer.warmup:g} s, CUDA L2 {timer.cache}{threads}; CPU {cpu_name()} ({cpu_count()} cores)"]


def _is_bench_item(item):
    from pytest_autograd.pytest_adapter.keys import item_spec

    spec = item_spec(item)
    if spec is not None:
        return spec.check == "bench", spec.device
    return "autograd_bench" in getattr(item, "fixturenames", ()), None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    state = state_of(config)
    if state is None:
        return
    group_marks = state.enabled and config.pluginmanager.hasplugin("xdist")
    kept, deselected = [], []
    default_device = _default_device(config)
    for item in items:
        is_bench, device = _is_bench_item(item)
        if is_bench and not state.enabled and device is not None:
            item.add_marker(pytest.mark.skip(reason=OFF_REASON))
        if is_bench and group_marks:
            # One group per device: xdist --dist loadgroup runs a group on one worker, one item at a time.
            item.add_marker(pytest.mark.xdist_group(GROUP_PREFIX + (device or default_device)))
        (kept if is_bench or not state.only else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _default_device(config):
    try:
        from pytest_autograd.pytest_adapter.keys import SETTINGS

        return config.stash[SETTINGS].devices[0]
    except (KeyError, IndexError, ImportError):
        return "cpu"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    state = state_of(item.config)
    if state is not None:
        state.current_item = item
    try:
        yield
    finally:
        if state is not None:
            state.current_item = None


class BenchSession:
    """Per-run hooks that need the state: gathering rows, writing files, the summary."""

    def __init__(self, config, state):
        self.config = config
        self.state = state

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                data = json.loads(value)
                self.state.rows.extend(data["rows"])
                machine = self.state.machine = self.state.machine or {}
                for key, value in (data.get("machine") or {}).items():
                    if machine.get(key) is None:
                        machine[key] = value  # e.g. the GPU's name, known once a CUDA item ran

    def pytest_sessionfinish(self, session):
        state = self.state
        if _is_worker(self.config) or not state.rows:
            return
        from pytest_autograd.bench import results

        try:
            self._write_files(state, results)
        except (OSError, results.BaselineProblem) as problem:
            state.notes.append(f"could not write benchmark files: {problem}")

    @staticmethod
    def _write_files(state, results):
        rows = state.rows
        if state.json_path:
            results.write_json(state.json_path, rows, state.machine, state.root)
            state.notes.append(f"wrote {len(rows)} timing(s) to {state.json_path}")
        if state.save:
            path = results.write_json(results.baseline_path(state.root, state.save), rows, state.machine,
                                      state.root, merge=True)
            state.notes.append(f"saved {len(rows)} timing(s) as baseline {state.save!r} ({path})")
        if state.compare and state.compare != state.save:
            missing = [row for row in rows if row.get("baseline_missing")]
            if missing:
                path = results.baseline_path(state.root, state.compare)
                existed = path.exists()
                results.write_json(path, missing, state.machine, state.root, merge=True)
                if existed:
                    state.notes.append(f"note: baseline {state.compare!r} had no entry for {len(missing)} "
                                       f"timing(s): added them to {path}")
                else:
                    state.notes.append(f"note: baseline {state.compare!r} did not exist; saved this run's "
                                       f"{len(missing)} timing(s) to {path} for the next comparison")
        if state.plot_dir:
            from pytest_autograd.bench.plot import write_plots

            paths, problem = write_plots(rows, state.plot_dir)
            state.notes.append(f"plots: {problem}" if problem else f"wrote {len(paths)} plot(s) to {state.plot_dir}")

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        state, config = self.state, self.config
        if _is_worker(config) or not state.rows:
            return
        from pytest_autograd.bench.table import machine_line, render

        lines, notes = render(state.rows, state.machine, state.compare)
        terminalreporter.section("autograd bench")
        terminalreporter.write_line(machine_line(state.machine))
        for line in lines:
            terminalreporter.write_line(line)
        if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
            if config.getoption("dist", None) != "loadgroup":
                notes.append("xdist: benchmarks ran beside other tests; use --dist loadgroup to run them "
                             "one at a time per device")
        for note in notes + state.notes:
            terminalreporter.write_line(note)


def _is_worker(config):
    return hasattr(config, "workerinput")


@pytest.fixture
def autograd_bench(request):
    """``autograd_bench(fn, *args, reference=None, **options)``: time ``fn`` (and ``reference``).

    Times forward, backward alone and forward+backward on the tensors'
    device; returns a BenchResult (``.forward.median``, ``.speedup("forward")``
    ...). Skipped unless ``--autograd-bench``; the timings join the summary,
    JSON and baselines, and a regression fails the test.
    """
    if not bench_enabled(request.config):
        pytest.skip("benchmarks are off: pass --autograd-bench to run autograd_bench")
    from pytest_autograd.pytest_adapter.bench_fixture import make_bench

    return make_bench(request, state_of(request.config))
