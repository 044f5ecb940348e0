"""Benchmark settings from the command line and the marker, validated without torch.

Every bad value is reported as a usage error naming the option and an
example of a good one, never as a traceback from inside a timer.
"""

import re
from dataclasses import dataclass, replace

from pytest_autograd.bench.defaults import DEFAULT_BUDGET, DEFAULT_NOISE, DEFAULT_WARMUP

DEFAULT_MIN_ROUNDS = 10
CACHE_MODES = ("cold", "warm")
DIRECTIONS = ("forward", "backward", "forward+backward")
FAIL_FIELDS = ("min", "max", "mean", "median", "q1", "q3", "stddev", "iqr")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class BadSetting(ValueError):
    """A bad benchmark setting; the message says which and how to fix it."""


@dataclass(frozen=True)
class TimerConfig:
    """How long and how carefully one timing runs."""

    budget: float = DEFAULT_BUDGET
    noise: float = DEFAULT_NOISE
    warmup: float = DEFAULT_WARMUP
    min_rounds: int = DEFAULT_MIN_ROUNDS
    cache: str = "cold"  # CUDA only: flush L2 before every call ("cold") or not ("warm")
    threads: int = None  # CPU only: torch threads while timing (None: leave torch's setting)

    def with_options(self, budget=None, noise=None, cache=None, where="marker"):
        """A copy with per-test overrides applied (``bench_budget=`` etc. on the marker)."""
        changes = {}
        if budget is not None:
            changes["budget"] = parse_seconds(budget, f"{where} bench_budget=")
        if noise is not None:
            changes["noise"] = parse_fraction(noise, f"{where} bench_noise=")
        if cache is not None:
            changes["cache"] = parse_cache(cache, f"{where} bench_cache=")
        return replace(self, **changes)


@dataclass(frozen=True)
class FailRule:
    """One ``FIELD:LIMIT`` of ``--autograd-bench-fail``: relative (10%) or absolute seconds."""

    field: str
    limit: float
    relative: bool

    def exceeded(self, old, new):
        if old is None or new is None:
            return False
        if self.relative:
            return old > 0 and new > old * (1 + self.limit)
        return new - old > self.limit

    def describe(self):
        if self.relative:
            return f"{self.field} +{self.limit * 100:g}%"
        return f"{self.field} +{self.limit:g} s"


def parse_seconds(value, source):
    try:
        seconds = float(str(value).strip().rstrip("s"))
    except ValueError:
        raise BadSetting(f"{source}: {value!r} is not a number of seconds; use e.g. 0.5") from None
    if not seconds > 0:
        raise BadSetting(f"{source}: must be a positive number of seconds, got {value!r}")
    return seconds


def parse_threads(value, source):
    try:
        threads = int(str(value).strip())
    except ValueError:
        threads = 0
    if threads < 1:
        raise BadSetting(f"{source}: {value!r} is not a thread count; use e.g. 1 (steadiest) or 4")
    return threads


def parse_fraction(value, source):
    """``0.03`` or ``3%`` -> 0.03."""
    text = str(value).strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise BadSetting(f"{source}: {value!r} is not a fraction; use e.g. 0.03 or 3%") from None
    if not 0 < fraction < 10:
        raise BadSetting(f"{source}: must be a positive fraction such as 0.03 or 3%, got {value!r}")
    return fraction


def parse_cache(value, source):
    text = str(value).strip().lower()
    if text not in CACHE_MODES:
        raise BadSetting(f"{source}: {value!r} is not a cache mode; use cold (flush L2 before each call) or warm")
    return text


def parse_fail(text, source="--autograd-bench-fail"):
    """``median:10%,min:0.002`` -> [FailRule, ...]."""
    rules = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        field, sep, limit = part.partition(":")
        field = field.strip().lower()
        if not sep or field not in FAIL_FIELDS:
            raise BadSetting(
                f"{source}: {part!r} is not FIELD:LIMIT; use e.g. median:10% (relative) or min:0.001 (seconds); "
                f"fields: {', '.join(FAIL_FIELDS)}"
            )
        limit = limit.strip()
        relative = limit.endswith("%")
        try:
            value = float(limit[:-1]) / 100 if relative else float(limit.rstrip("s"))
        except ValueError:
            raise BadSetting(f"{source}: {limit!r} in {part!r} is not a number; use e.g. median:10%") from None
        if value < 0:
            raise BadSetting(f"{source}: the limit in {part!r} must not be negative")
        rules.append(FailRule(field, value, relative))
    if not rules:
        raise BadSetting(f"{source}: no rule given; use e.g. median:10%")
    return rules


def parse_baseline_name(name, source):
    if not _NAME.match(str(name)) or str(name) in (".", ".."):
        raise BadSetting(f"{source}: {name!r} is not a baseline name; use letters, digits, '_', '-' or '.', e.g. main")
    return str(name)


def parse_sweep(values, where):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise BadSetting(f"{where}: sweep= must be a list of sizes, e.g. sweep=[256, 1024, 4096]; got {values!r}")
    values = list(values)
    if not values:
        raise BadSetting(f"{where}: sweep= is empty; give the sizes to time, e.g. sweep=[256, 1024, 4096]")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise BadSetting(f"{where}: sweep= values must be numbers or strings, got {value!r}")
    if len(set(values)) != len(values):
        raise BadSetting(f"{where}: sweep= repeats a size: {values!r}")
    return values


def parse_samples(value, count, where):
    """``bench_samples=``: an index, a list of indices or "all" -> list of indices."""
    if value is None:
        return [0]
    if value == "all":
        return list(range(count))
    indices = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        indices = [int(i) for i in indices if not isinstance(i, bool)]
    except (TypeError, ValueError):
        indices = None
    if not indices or any(i < 0 or i >= count for i in indices):
        raise BadSetting(f"{where}: bench_samples={value!r} must be a sample index below {count}, "
                         "a list of them, or 'all'")
    return list(dict.fromkeys(indices))


def parse_directions(value, where):
    if value is None:
        return list(DIRECTIONS)
    names = [value] if isinstance(value, str) else list(value)
    aliases = {"fwd": "forward", "bwd": "backward", "both": "forward+backward", "fwd+bwd": "forward+backward"}
    result = []
    for name in names:
        name = aliases.get(name, name)
        if name not in DIRECTIONS:
            raise BadSetting(f"{where}: unknown direction {name!r}; use forward, backward and/or forward+backward")
        result.append(name)
    return list(dict.fromkeys(result))
