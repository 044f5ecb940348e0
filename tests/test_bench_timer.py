"""The timer's own correctness: known costs, repeatability, statistics, stopping, roofline counts.

No test here asserts how fast the product is; they assert that the timer
reads a known cost correctly and reports its own noise honestly. Where
the question is what lies inside a timed region, the cost is spent on a
virtual clock. Where it is the real clock's fidelity, work is a pure-Python
busy loop: single-threaded and deterministic, so it stays proportional to
its iteration count even on a busy 2-core machine.
"""

import statistics

import pytest
import torch

from pytest_autograd.bench import config as bench_config
from pytest_autograd.bench import roofline
from pytest_autograd.bench.config import BadSetting, TimerConfig
from pytest_autograd.bench.stats import Stats, fmt_time
from pytest_autograd.bench.timers import measure

QUICK = TimerConfig(budget=0.25, noise=0.02, warmup=0.02)


def spin(iterations):
    total = 0
    for i in range(iterations):
        total += i
    return total


def calibrated_iterations(seconds):
    """Iterations of ``spin`` taking about ``seconds`` here and now."""
    iterations = 1000
    while True:
        measured = measure(lambda: spin(iterations), config=TimerConfig(budget=0.02, warmup=0.005)).median
        if measured >= seconds / 4 or iterations > 10**8:
            return max(1, int(iterations * seconds / measured))
        iterations *= 4


class VirtualClock:
    """A clock that moves only when told to: what lies inside a timed region, without a real clock's noise.

    Each read moves it on by a nanosecond, so the timer's own loops still end.
    """

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1e-9
        return self.now

    def spend(self, seconds):
        self.now += seconds


@pytest.fixture
def virtual_clock(monkeypatch):
    from pytest_autograd.bench import timers

    clock = VirtualClock()
    monkeypatch.setattr(timers, "_perf", clock)
    monkeypatch.setattr(timers, "_thread_time", clock)
    return clock


def on_a_real_clock(trial, attempts=3):
    """Run ``trial`` until it passes, at most ``attempts`` times.

    A real clock on a shared machine: one slow spell can cover a whole
    attempt, while a timer that misreads costs fails every attempt.
    """
    for attempt in range(attempts):
        try:
            return trial()
        except AssertionError:
            if attempt == attempts - 1:
                raise


def test_double_the_work_reads_about_twice_the_time():
    # Calls far shorter than a round: both ops are timed in rounds of about the same length, so
    # interruptions hit both alike. Short measurements, interleaved in pairs: a slow spell of
    # a shared (virtual) machine then lands on both sides of a pair rather than on one op.
    n = calibrated_iterations(25e-6)
    config = TimerConfig(budget=0.04, noise=0.02, warmup=0.005)

    def trial():
        ratios, noises = [], []
        for _ in range(7):
            single = measure(lambda: spin(n), config=config)
            double = measure(lambda: spin(2 * n), config=config)
            ratios.append(double.median / single.median)
            noises.append(single.noise + double.noise)
        ratio = statistics.median(ratios)
        assert 1.6 <= ratio <= 2.5, f"ratios {ratios}, noise {noises}"
        # ... and within the noise the timer itself reports (with a floor for a quiet machine).
        assert abs(ratio - 2) / 2 <= max(0.25, 2 * statistics.median(noises)), f"ratios {ratios}, noise {noises}"

    on_a_real_clock(trial)


def test_repeated_runs_agree_within_their_reported_noise():
    # The typical run must sit within the noise the runs report. The median absolute deviation
    # ignores a run or two caught by a slow or fast spell of a shared machine: the IQR of one
    # run cannot see a change of machine speed between runs (docs/bench.md, Limits).
    n = calibrated_iterations(1e-3)

    def trial():
        runs = [measure(lambda: spin(n), config=QUICK) for _ in range(5)]
        medians = [run.median for run in runs]
        centre = statistics.median(medians)
        deviation = statistics.median(abs(m - centre) for m in medians) / centre
        reported = statistics.median(run.noise for run in runs)
        assert deviation <= max(2 * reported, 0.05), (f"medians {[fmt_time(m) for m in medians]}: typical deviation "
                                                      f"{deviation:.1%}, reported noise {reported:.1%}")

    on_a_real_clock(trial)


def test_timer_reports_rounds_noise_and_how_it_stopped():
    result = measure(lambda: spin(200), config=TimerConfig(budget=0.05, warmup=0.005))
    assert result.rounds >= 3
    assert result.stop in ("noise", "budget", "rounds")
    assert result.timer == "perf_counter" and result.cache == "warm"
    assert result.threads == torch.get_num_threads()
    assert result.block >= 1 and result.stats.iterations == result.block
    assert result.noise == pytest.approx(result.iqr / result.median)


def test_cheap_calls_are_timed_in_blocks():
    result = measure(lambda: None, config=TimerConfig(budget=0.05, warmup=0.005))
    assert result.block > 100  # one call is far below the clock's resolution


def test_a_tiny_budget_stops_on_the_budget_and_warns():
    calls = []

    def uneven():
        calls.append(1)
        spin(2000 if len(calls) % 2 else 20000)  # alternating costs: IQR stays wide

    result = measure(uneven, config=TimerConfig(budget=0.02, noise=0.001, warmup=0.001, min_rounds=3))
    assert result.stop == "budget"
    assert result.noisy and result.warning()


def test_setup_runs_outside_the_timed_region(virtual_clock):
    timed = measure(lambda state: virtual_clock.spend(1e-4), config=QUICK, setup=lambda: virtual_clock.spend(2e-2))
    assert timed.block == 1
    assert timed.median == pytest.approx(1e-4, rel=1e-3)


def test_threads_option_sets_and_restores_torch_threads():
    before = torch.get_num_threads()
    seen = []
    measure(lambda: seen.append(torch.get_num_threads()), config=TimerConfig(budget=0.01, warmup=0.001, threads=1))
    assert set(seen) == {1}
    assert torch.get_num_threads() == before


def test_stats_match_pytest_benchmark_field_for_field():
    reference = pytest.importorskip("pytest_benchmark.stats")
    for data in ([3.0], [1.0, 2.0], [5.0, 1.0, 4.0], [1.0, 9.0, 2.0, 8.0, 3.0], [float(i % 7) + 1 for i in range(23)]):
        theirs = reference.Stats()
        for value in data:
            theirs.update(value)
        ours = Stats(data)
        for name in reference.Stats.fields:
            assert getattr(ours, name) == pytest.approx(getattr(theirs, name)), name


def test_stats_round_trip_through_a_saved_dict():
    stats = Stats([1e-3, 2e-3, 4e-3], iterations=7)
    saved = stats.as_dict()
    assert saved["iterations"] == 7 and saved["data"] == [1e-3, 2e-3, 4e-3]
    assert Stats.from_dict(saved).median == stats.median
    without_data = {k: v for k, v in saved.items() if k != "data"}
    assert Stats.from_dict(without_data).median == stats.median


def test_times_are_printed_with_a_readable_unit():
    assert [fmt_time(t) for t in (2.5, 1.05e-3, 12.3e-6, 8.12e-7)] == ["2.5 s", "1.05 ms", "12.3 us", "812 ns"]


@pytest.mark.parametrize("text, fields", [("median:10%", [("median", 0.1, True)]),
                                          ("min:0.002,mean:5%", [("min", 0.002, False), ("mean", 0.05, True)])])
def test_fail_rules_parse(text, fields):
    rules = bench_config.parse_fail(text)
    assert [(r.field, pytest.approx(r.limit), r.relative) for r in rules] == fields


@pytest.mark.parametrize("text", ["median", "speed:10%", "median:ten%", ""])
def test_bad_fail_rules_name_the_fix(text):
    with pytest.raises(BadSetting, match="median:10%"):
        bench_config.parse_fail(text)


def test_fail_rule_limits():
    relative, absolute = bench_config.parse_fail("median:10%,min:0.001")
    assert relative.exceeded(1.0, 1.2) and not relative.exceeded(1.0, 1.05)
    assert absolute.exceeded(0.001, 0.0025) and not absolute.exceeded(0.001, 0.0015)


def test_noise_accepts_percent_and_fraction():
    assert bench_config.parse_fraction("3%", "x") == pytest.approx(0.03)
    assert bench_config.parse_fraction("0.05", "x") == pytest.approx(0.05)
    with pytest.raises(BadSetting, match="3%"):
        bench_config.parse_fraction("loud", "--autograd-bench-noise")


def test_flop_counter_counts_a_matmul_forward_and_backward():
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(16, 4, requires_grad=True)
    counted = roofline.count_flops(lambda: [a @ b], lambda outs: torch.autograd.grad(outs, [a, b], [torch.ones(8, 4)]))
    assert counted["forward"] == 2 * 8 * 16 * 4
    assert counted["backward"] == 2 * counted["forward"]
    assert counted["forward+backward"] == 3 * counted["forward"]


def test_marker_overrides_replace_counted_figures():
    counted = {"forward": 100, "backward": 200}
    assert roofline.resolve(None, counted, (), {}, "flops")["forward+backward"] == 300
    assert roofline.resolve(50, counted, (), {}, "flops") == {"forward": 50, "backward": 200, "forward+backward": 250}
    assert roofline.resolve({"backward": 7}, counted, (), {}, "flops")["backward"] == 7
    by_size = roofline.resolve(lambda x: x.numel(), counted, (torch.zeros(3, 4),), {}, "flops")
    assert by_size["forward"] == 12
    with pytest.raises(BadSetting, match="direction"):
        roofline.resolve({"sideways": 1}, counted, (), {}, "flops")


def test_ideal_bytes_count_each_tensor_once():
    x = torch.zeros(10)
    assert roofline.tensor_bytes([x, x, torch.zeros(5, dtype=torch.float64)]) == 40 + 40
    assert roofline.rates(2e12, 1e9, 1.0) == (2.0, 1.0, 2000.0)
    assert roofline.rates(None, 0, 1.0) == (None, None, None)


class SlowForwardCheapBackward(torch.autograd.Function):
    """A known split on the virtual clock: 2 ms of forward, 10 us of backward."""

    clock = None

    @staticmethod
    def forward(ctx, x):
        SlowForwardCheapBackward.clock.spend(2e-3)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        SlowForwardCheapBackward.clock.spend(1e-5)
        return grad * 2


def test_backward_alone_does_not_count_the_forward(virtual_clock):
    from pytest_autograd.bench.measure import bench_point
    from pytest_autograd.engine.case import Sample, build_case

    SlowForwardCheapBackward.clock = virtual_clock
    sample = Sample(torch.randn(16))
    case = build_case({"op": SlowForwardCheapBackward}, [sample])
    result = bench_point(case, sample, "cpu", None, TimerConfig(budget=0.1, warmup=0.01), list(bench_config.DIRECTIONS),
                         torch.Generator().manual_seed(0))
    # The virtual clock moves only inside the op, so each direction reads exactly what it ran.
    assert result.forward.median == pytest.approx(2e-3, rel=1e-3)
    assert result.backward.median == pytest.approx(1e-5, rel=1e-2)
    assert result.forward_backward.median == pytest.approx(2e-3 + 1e-5, rel=1e-3)
    assert result.reference is None and result.speedup() is None


def test_cpu_timings_that_waited_for_a_core_are_flagged():
    from pytest_autograd.bench.timers import Measurement

    def timing(threads, share, load=1.0):
        return Measurement(Stats([1e-3] * 10), "cpu", "perf_counter", "warm", "noise", 0.03, 1, 1, 0.0,
                           threads=threads, load=load, cores=2, cpu_share=share)

    assert timing(threads=1, share=0.4).busy
    assert "ran 40% of the time" in timing(threads=1, share=0.4).warning()
    assert "--autograd-bench-threads" not in timing(threads=1, share=0.4).warning()
    # Several threads spin while waiting for each other: an oversubscribed machine shows in the load.
    assert timing(threads=2, share=0.97, load=5.5).busy
    assert "--autograd-bench-threads=1" in timing(threads=2, share=0.97, load=5.5).warning()
    assert not timing(threads=1, share=0.97, load=5.5).busy
    assert not timing(threads=2, share=0.97).busy and timing(threads=2, share=0.97).warning() is None


def test_the_cpu_share_of_a_busy_loop_is_near_one_and_of_a_sleep_near_zero():
    import time

    spinning = measure(lambda: spin(2000), config=TimerConfig(budget=0.05, warmup=0.005))
    sleeping = measure(lambda: time.sleep(1e-3), config=TimerConfig(budget=0.05, warmup=0.005))
    assert 0 < spinning.cpu_share <= 1 and sleeping.cpu_share < 0.5 and sleeping.busy


def test_cuda_path_times_with_events_flushes_outside_them_and_syncs_once_per_batch(monkeypatch):
    """The CUDA timer's structure, checked on CPU with stand-ins for events, sync and the flush buffer."""
    import contextlib

    from pytest_autograd.bench import timers

    gpu_clock, log = [0.0], []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = gpu_clock[0]
            log.append("record")

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3  # milliseconds, like CUDA events

    class FlushBuffer:
        def zero_(self):
            gpu_clock[0] += 5e-3  # a slow flush: it must not show in the timings
            log.append("flush")

    real_empty = torch.empty
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(timers, "l2_flush_bytes", lambda device: 1)
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **k:
                        FlushBuffer() if str(device).startswith("cuda") else real_empty(*a, device=device, **k))

    def op():
        gpu_clock[0] += 1e-3  # every call costs 1 ms of "GPU" time
        log.append("op")

    result = measure(op, "cuda", TimerConfig(budget=0.05, warmup=0.005))
    assert (result.timer, result.cache) == ("cuda-events", "cold")
    assert result.median == pytest.approx(1e-3) and result.noise == pytest.approx(0, abs=1e-9)
    timed = log[log.index("flush"):]
    assert timed[:4] == ["flush", "record", "op", "record"]  # flush before the start event
    assert timed.count("op") == timed.count("flush") >= result.rounds
    assert timed.count("sync") == -(-timed.count("op") // result.block)  # one synchronize per batch
    assert result.block > 1

    log.clear()
    warm = measure(op, "cuda", TimerConfig(budget=0.05, warmup=0.005, cache="warm"))
    assert warm.cache == "warm" and "flush" not in log
