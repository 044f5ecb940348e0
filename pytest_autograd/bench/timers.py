"""Timing one callable on one device: the part people get wrong by hand.

CUDA: an untimed first call (lazy init, autotuning), a time-based warm-up,
then CUDA events around every call with one synchronisation per batch, and
by default an L2 flush before each call, outside the events (cold cache).
CPU: an untimed first call, a warm-up, then blocks of calls sized so the
clock's own overhead is negligible, in the manner of
``torch.utils.benchmark.Timer.adaptive_autorange``.
Both stop once the rounds agree (IQR / median below the noise target) or
the time budget is spent, and say which.
"""

import contextlib
import gc
import math
import os
import statistics
import time
from dataclasses import dataclass, field

from pytest_autograd.bench.config import TimerConfig
from pytest_autograd.bench.measure_info import cpu_count
from pytest_autograd.bench.stats import Stats, fmt_percent

MAX_ROUNDS = 10_000
_CUDA_BATCH_SECONDS = 0.02  # GPU time between two synchronisations
_perf = time.perf_counter


@dataclass
class Measurement:
    """One timing: per-call statistics plus how they were obtained."""

    stats: Stats
    device: str
    timer: str  # "cuda-events", "perf_counter" or "perf_counter+sync"
    cache: str  # "cold" (L2 flushed before each call) or "warm"
    stop: str  # "noise" (target reached), "budget" (time ran out) or "rounds" (round cap)
    noise_target: float
    block: int  # calls per timed round (CPU) or per synchronisation (CUDA)
    warmup_calls: int
    first_call: float  # seconds taken by the untimed first call
    threads: int = None
    load: float = None  # 1-minute load average when a CPU timing ended
    cores: int = None
    cpu_share: float = None  # CPU: the timing thread's CPU time / wall time over the timed rounds
    notes: list = field(default_factory=list)

    @property
    def median(self):
        return self.stats.median

    @property
    def iqr(self):
        return self.stats.iqr

    @property
    def noise(self):
        return self.stats.noise

    @property
    def rounds(self):
        return self.stats.rounds

    @property
    def noisy(self):
        return self.noise > self.noise_target

    @property
    def busy(self):
        """True when the timing thread spent a good part of the timed rounds off the CPU.

        That is time spent waiting for a core (a busy machine), or, with
        several torch threads, waiting in parallel regions for descheduled
        threads: it can shift every round alike, so the IQR cannot show it.
        """
        if self.cpu_share is not None and self.cpu_share < 0.85:
            return True
        # Threads spin while they wait for each other, so for several threads the CPU share
        # stays high: judge by the load, which counts this benchmark's own threads too.
        return ((self.threads or 1) > 1 and self.load is not None and self.cores is not None
                and self.load > self.cores + 0.5)

    def warning(self):
        """A short warning when these numbers deserve less trust, else None."""
        if self.busy:
            load = f", load {self.load:.1f} on {self.cores} cores" if self.load is not None else ""
            advice = "use --autograd-bench-threads=1 or a quiet machine" if (self.threads or 1) > 1 \
                else "use a quiet machine"
            share = f"the timing thread ran {self.cpu_share:.0%} of the time" if self.cpu_share is not None else ""
            return f"busy machine: {share}{load}; {advice}".replace(": , ", ": ")
        if self.rounds < 5:
            return f"only {self.rounds} rounds in the budget: raise --autograd-bench-budget"
        if self.noisy:
            return (f"noisy: IQR is {fmt_percent(self.noise)} of the median (target {fmt_percent(self.noise_target)}); "
                    "raise --autograd-bench-budget or quiet the machine")
        return None


def measure(fn, device="cpu", config=None, setup=None):
    """Time ``fn()`` (or ``fn(setup())``, with ``setup`` untimed before every call) on ``device``."""
    config = config or TimerConfig()
    kind = str(device).split(":", 1)[0]
    if kind == "cuda":
        return _measure_cuda(fn, setup, config, str(device))
    if kind == "cpu":
        with _torch_threads(config.threads):
            return _measure_wall(fn, setup, config, str(device), sync=None)
    return _measure_wall(fn, setup, config, str(device), sync=_device_sync(kind))


@contextlib.contextmanager
def _torch_threads(threads):
    """Run with ``threads`` intra-op threads (None: as configured), restoring the setting after."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _device_sync(kind):
    import torch

    backend = getattr(torch, kind, None)
    sync = getattr(backend, "synchronize", None)
    return sync if callable(sync) else None


def _threads():
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:  # pragma: no cover - torch is a dependency
        return None


class _Stopper:
    """The stopping rule: noise target after enough rounds and time, else the budget."""

    def __init__(self, config):
        self.config = config
        self.started = _perf()
        self.next_check = config.min_rounds

    def __call__(self, times):
        elapsed = _perf() - self.started
        rounds = len(times)
        if rounds >= MAX_ROUNDS:
            return "rounds"
        if rounds >= self.next_check and elapsed >= 0.1 * self.config.budget:
            # Checking costs a sort: do it at geometrically spaced round counts.
            self.next_check = rounds + max(1, rounds // 8)
            if _relative_iqr(times) <= self.config.noise:
                return "noise"
        if elapsed >= self.config.budget and rounds >= 3:
            return "budget"
        return None


def _relative_iqr(times):
    if len(times) < 2:
        return float("inf")
    q1, _, q3 = statistics.quantiles(times, n=4)
    median = statistics.median(times)
    return (q3 - q1) / median if median > 0 else 0.0


def _call_once(fn, setup):
    return fn(setup()) if setup is not None else fn()


def _measure_wall(fn, setup, config, device, sync):
    """CPU (and other devices with a ``synchronize``): wall clock around blocks of calls."""
    sync = sync or _no_sync
    started = _perf()
    _call_once(fn, setup)
    sync()
    first_call = _perf() - started
    warmup_calls, started = 0, _perf()
    while True:
        _call_once(fn, setup)
        warmup_calls += 1
        sync()
        if _perf() - started >= config.warmup:
            break
    estimate = (_perf() - started) / warmup_calls
    block = 1 if setup is not None else _block_size(fn, estimate, config, sync)
    times, stopper = [], _Stopper(config)
    enabled = gc.isenabled()
    on_cpu = wall = 0.0  # how much of the timed wall time this thread actually ran
    try:
        while True:
            if setup is not None:
                state = setup()
                sync()
                gc.disable()
                cpu_begin, begin = _thread_time(), _perf()
                fn(state)
                sync()
                end, cpu_end = _perf(), _thread_time()
                elapsed = end - begin
            else:
                gc.disable()
                cpu_begin, begin = _thread_time(), _perf()
                for _ in range(block):
                    fn()
                sync()
                end, cpu_end = _perf(), _thread_time()
                elapsed = (end - begin) / block
            if enabled:
                gc.enable()  # collect garbage between rounds, never inside one
            on_cpu += cpu_end - cpu_begin
            wall += end - begin
            times.append(max(elapsed, 1e-12))
            stop = stopper(times)
            if stop:
                break
    finally:
        if enabled:
            gc.enable()
    timer = "perf_counter" if device.startswith("cpu") else "perf_counter+sync"
    return Measurement(Stats(times, block), device, timer, "warm", stop, config.noise, block, warmup_calls,
                       first_call, threads=_threads(), load=_load(), cores=cpu_count(),
                       cpu_share=min(1.0, on_cpu / wall) if wall > 0 and sync is _no_sync else None)


def _no_sync():
    pass


_thread_time = getattr(time, "thread_time", time.process_time)


def _load():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _clock_overhead():
    samples = []
    for _ in range(7):
        begin = _perf()
        samples.append(_perf() - begin)
    return statistics.median(samples)


def _block_size(fn, estimate, config, sync):
    """Calls per round: enough that reading the clock costs < 0.01% of a round.

    Like ``Timer._estimate_block_size``, grown by timing real blocks, but
    capped so that the budget still holds ``min_rounds`` rounds twice over.
    """
    target = max(1e4 * _clock_overhead(), 1e-5)
    target = min(target, config.budget / (2 * config.min_rounds))
    block = max(1, int(target / max(estimate, 1e-9)))
    for _ in range(20):
        begin = _perf()
        for _ in range(block):
            fn()
        sync()
        taken = _perf() - begin
        if taken >= target:
            break
        # Grow towards the target rather than doubling past it: rounds of about the same
        # length for every op keep a busy machine's interruptions proportional.
        block = max(block + 1, math.ceil(block * 1.05 * target / max(taken, 1e-9)))
    return block


def l2_flush_bytes(device):
    """Bytes to overwrite so that nothing of the op's data stays in L2: twice its size."""
    import torch

    try:
        size = int(torch.cuda.get_device_properties(device).L2_cache_size)
    except (AttributeError, RuntimeError):
        size = 0
    return max(2 * size, 8 << 20) if size else 256 << 20


def _measure_cuda(fn, setup, config, device):
    """CUDA events around every call, one synchronize per batch, L2 flushed outside the events."""
    import torch

    dev = torch.device(device)
    with torch.cuda.device(dev):
        started = _perf()
        _call_once(fn, setup)
        torch.cuda.synchronize()
        first_call = _perf() - started
        warmup_calls, started = 0, _perf()
        while True:
            _call_once(fn, setup)
            warmup_calls += 1
            if warmup_calls % 8 == 0 or warmup_calls < 8:
                torch.cuda.synchronize()
                if _perf() - started >= config.warmup:
                    break
        estimate = (_perf() - started) / warmup_calls
        flush = torch.empty(l2_flush_bytes(dev), dtype=torch.int8, device=dev) if config.cache == "cold" else None
        batch = int(min(_CUDA_BATCH_SECONDS, config.budget / (2 * config.min_rounds)) / max(estimate, 1e-6))
        batch = max(1, min(batch, 512))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        times, stopper, stop = [], _Stopper(config), None
        torch.cuda.synchronize()
        while stop is None:
            for start, end in zip(starts, ends):
                state = setup() if setup is not None else None
                if flush is not None:
                    flush.zero_()
                start.record()
                if setup is not None:
                    fn(state)
                else:
                    fn()
                end.record()
            torch.cuda.synchronize()  # the one synchronisation of this batch
            for start, end in zip(starts, ends):
                times.append(max(start.elapsed_time(end) * 1e-3, 1e-12))
                stop = stop or stopper(times)
        del flush
    return Measurement(Stats(times, 1), device, "cuda-events", config.cache, stop, config.noise, batch,
                       warmup_calls, first_call, threads=_threads())
