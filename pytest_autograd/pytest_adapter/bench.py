"""pytest side of the benchmarks: options, collection, the fixture; the session's state and hooks are in
:mod:`bench_session`.

Imports no torch at module level, nor the bench package: without a bench
option nothing here costs more than declaring the options, and the state
(benchmarks off) is built only if a bench item or the fixture asks for it.
Rows reach the one summary through report ``user_properties``, so xdist
workers and a plain run behave the same; only the controller writes JSON,
baselines and plots.
"""

import pytest

from pytest_autograd.bench.defaults import DEFAULT_BUDGET, DEFAULT_NOISE, DEFAULT_WARMUP

STATE = pytest.StashKey()


def state_of(config):
    """The bench session's state; None outside a session. Without a bench option it is built on first use."""
    if config is None:
        return None
    if STATE not in config.stash:
        from pytest_autograd.pytest_adapter.bench_session import build_state

        config.stash[STATE] = build_state(config)  # no option given: nothing in it can be a bad setting
    return config.stash[STATE]


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
                                          f"(default {DEFAULT_BUDGET})")),
    ("--autograd-bench-noise", dict(default=None, metavar="FRACTION",
                                    help=f"stop a timing once IQR/median is below this, e.g. 0.03 or 3%% "
                                         f"(default {DEFAULT_NOISE:g})")),
    ("--autograd-bench-warmup", dict(default=None, metavar="SECONDS",
                                     help=f"untimed warm-up after the first call "
                                          f"(default {DEFAULT_WARMUP})")),
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
        group.addoption(name, dest=_dest(name), **kwargs)


def _options_given(config):
    return any(config.getoption(_dest(name), None) not in (None, False) for name, _ in OPTIONS)


def _dest(option):
    return option.lstrip("-").replace("-", "_")


def pytest_configure(config):
    """With a bench option, the state is checked at start-up (a bad value is a usage error) and the session's
    hooks registered; without one, benchmarks are off and nothing is done until something asks."""
    if not _options_given(config):
        return
    from pytest_autograd.bench.config import BadSetting
    from pytest_autograd.pytest_adapter.bench_session import BenchSession, build_state

    try:
        state = build_state(config)
    except BadSetting as problem:
        raise pytest.UsageError(str(problem)) from None
    config.stash[STATE] = state
    config.pluginmanager.register(BenchSession(config, state), "autograd-bench-session")


def pytest_report_header(config):
    state = config.stash.get(STATE, None)  # benchmarks on: built at start-up
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
    if STATE not in config.stash and not any(_is_bench_item(item)[0] for item in items):
        return  # benchmarks off and no bench item: nothing to skip, group or deselect
    from pytest_autograd.bench.state import GROUP_PREFIX, OFF_REASON

    state = state_of(config)
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
    state = item.config.stash.get(STATE, None)
    if state is not None:
        state.current_item = item
    try:
        yield
    finally:
        if state is not None:
            state.current_item = None


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
