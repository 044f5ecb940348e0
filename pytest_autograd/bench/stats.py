"""Summary statistics of per-call times, field for field those of pytest-benchmark.

Pure Python so that the controller process can summarise, compare and write
JSON without importing torch. Times are seconds per call.
"""

import math
import statistics
from bisect import bisect_left, bisect_right

FIELDS = (
    "min", "max", "mean", "stddev", "rounds", "median", "iqr", "q1", "q3",
    "iqr_outliers", "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops", "total",
)


def _quartiles(data):
    """(q1, q3) of sorted ``data`` by the same method pytest-benchmark uses."""
    n = len(data)
    if n == 1:
        return data[0], data[0]
    if n % 2:
        k, r = n // 4, n % 4
        if r == 1:
            return 0.25 * data[k - 1] + 0.75 * data[k], 0.75 * data[3 * k] + 0.25 * data[3 * k + 1]
        return 0.75 * data[k] + 0.25 * data[k + 1], 0.25 * data[3 * k + 1] + 0.75 * data[3 * k + 2]
    return statistics.median(data[: n // 2]), statistics.median(data[n // 2:])


class Stats:
    """Per-call times (seconds) of one measurement and what follows from them."""

    def __init__(self, data, iterations=1):
        if not data:
            raise ValueError("Stats needs at least one time")
        self.data = [float(value) for value in data]
        self.iterations = int(iterations)
        self.sorted = sorted(self.data)
        self.rounds = len(self.data)
        self.min, self.max = self.sorted[0], self.sorted[-1]
        self.total = math.fsum(self.data)
        self.mean = self.total / self.rounds
        self.stddev = statistics.stdev(self.data) if self.rounds > 1 else 0.0
        self.median = statistics.median(self.sorted)
        self.q1, self.q3 = _quartiles(self.sorted)
        self.iqr = self.q3 - self.q1

    @property
    def noise(self):
        """Relative spread, IQR / median: the figure the stopping rule and warnings use."""
        return self.iqr / self.median if self.median > 0 else 0.0

    @property
    def iqr_outliers(self):
        low, high = self.q1 - 1.5 * self.iqr, self.q3 + 1.5 * self.iqr
        return sum(1 for value in self.data if value < low or value > high)

    @property
    def stddev_outliers(self):
        low, high = self.mean - self.stddev, self.mean + self.stddev
        return sum(1 for value in self.data if value < low or value > high)

    @property
    def outliers(self):
        return f"{self.stddev_outliers};{self.iqr_outliers}"

    @property
    def ld15iqr(self):
        if self.rounds == 1:
            return self.data[0]
        return self.sorted[bisect_left(self.sorted, self.q1 - 1.5 * self.iqr)]

    @property
    def hd15iqr(self):
        if self.rounds == 1:
            return self.data[0]
        position = bisect_right(self.sorted, self.q3 + 1.5 * self.iqr)
        return self.sorted[min(position, self.rounds - 1)]

    @property
    def ops(self):
        return self.rounds / self.total if self.total else 0.0

    def as_dict(self, include_data=True):
        """pytest-benchmark's ``stats`` object."""
        result = {name: getattr(self, name) for name in FIELDS}
        if include_data:
            result["data"] = list(self.data)
        result["iterations"] = self.iterations
        return result

    @classmethod
    def from_dict(cls, stats):
        """Rebuild from a saved ``stats`` object (needs ``data``; else a stand-in from the fields)."""
        data = stats.get("data")
        if data:
            return cls(data, stats.get("iterations", 1))
        return _Saved(stats)

    def __repr__(self):
        return f"Stats(median={fmt_time(self.median)}, iqr={fmt_time(self.iqr)}, rounds={self.rounds})"


class _Saved:
    """Stats read back from a file saved without raw data: the stored fields only."""

    def __init__(self, stats):
        for name in FIELDS + ("iterations",):
            setattr(self, name, stats.get(name))
        median, iqr = stats.get("median") or 0.0, stats.get("iqr") or 0.0
        self.noise = iqr / median if median else 0.0


def fmt_time(seconds):
    """A time with a unit a person reads at a glance: 812 ns, 12.3 us, 1.05 ms, 2.31 s."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def fmt_percent(fraction):
    return "-" if fraction is None else f"{100 * fraction:.1f}%"
