"""The bench session of a run that gave a bench option: its state, built (and checked) from the options, and
the per-run hooks that gather the timings, write the files and the summary."""

import json
from pathlib import Path

import pytest

from pytest_autograd.bench import config as bench_config
from pytest_autograd.bench.config import BadSetting, TimerConfig
from pytest_autograd.bench.state import PROPERTY, BenchState


def _option(config, name):
    return config.getoption(name, None)


def build_state(config):
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
