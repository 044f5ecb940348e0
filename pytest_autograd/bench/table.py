"""The end-of-session table: one line per op/device/dtype/direction (and size).

Op and reference lines sit together so the speedup reads at a glance;
numbers that deserve less trust carry a ``!`` and a note under the table.
"""

from pytest_autograd.bench.results import SHORT
from pytest_autograd.bench.stats import fmt_percent, fmt_time

_ORDER = {"forward": 0, "backward": 1, "forward+backward": 2}


def machine_line(machine):
    if not machine:
        return "machine: unknown"
    gpu = machine.get("gpu") or "none"
    cuda = machine.get("cuda") or "none"
    return (f"machine: {machine.get('cpu')} ({machine.get('cores')} cores, torch's default {machine.get('threads')} threads); "
            f"GPU {gpu}; torch {machine.get('torch')}; CUDA {cuda}")


def _size_key(size):
    return (0, size, "") if isinstance(size, (int, float)) else (1, 0, str(size))


def sort_rows(rows):
    first_seen = {}
    for row in rows:
        first_seen.setdefault((row["test"], row.get("label")), len(first_seen))
    return sorted(rows, key=lambda r: (first_seen[(r["test"], r.get("label"))], r.get("dtype") or "",
                                       _size_key(r.get("size")), r.get("sample") or 0,
                                       _ORDER.get(r["direction"], 9), r["impl"] != "op"))


def _rate(value):
    if value is None:
        return "-"
    return f"{value:.3g}"


def render(rows, machine=None, compare_name=None):
    """Lines of the table plus the notes under it."""
    rows = sort_rows(rows)
    has_size = any(r.get("size") is not None for r in rows)
    has_sample = any(r.get("sample") for r in rows)
    has_ref = any(r["impl"] == "reference" for r in rows)
    has_base = compare_name is not None
    header = ["test", "impl", "dir", "device", "dtype"] + (["sample"] if has_sample else []) + \
        (["size"] if has_size else []) + \
        ["median", "IQR", "noise", "rounds", "TFLOP/s", "GB/s"] + (["speedup"] if has_ref else []) + \
        (["vs " + compare_name] if has_base else [])
    table, notes, warned = [header], [], []
    for row in rows:
        test = row["test_name"] + (f"::{row['label']}" if row.get("label") else "")
        impl = row["impl_name"] if row["impl"] == "op" else f"ref {row['impl_name']}"
        noise = fmt_percent(row["noise"]) + ("!" if row.get("warning") else "")
        stats = row["stats"]
        cells = [test, impl, SHORT.get(row["direction"], row["direction"]), row["device"], row.get("dtype") or "-"]
        if has_sample:
            cells.append(str(row.get("sample") or 0))
        if has_size:
            cells.append("-" if row.get("size") is None else str(row["size"]))
        cells += [fmt_time(stats["median"]), fmt_time(stats["iqr"]), noise, str(stats["rounds"]),
                  _rate(row.get("tflops")), _rate(row.get("gbps"))]
        if has_ref:
            cells.append("-" if row.get("speedup") is None else f"{row['speedup']:.2f}x")
        if has_base:
            base = row.get("baseline")
            if base and base.get("ratio"):
                cells.append(f"{base['ratio']:.2f}x" + (" REGRESSED" if row.get("regressed") else ""))
            else:
                cells.append("new" if row.get("baseline_missing") else "-")
        table.append(cells)
        if row.get("warning"):
            warned.append((row, f"{test} {impl} {SHORT.get(row['direction'], row['direction'])}"))
        for note in row.get("notes") or []:
            text = f"{test} {impl}: {note}"
            if text not in notes:
                notes.append(text)
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines, warnings(warned, len(rows)) + notes + legend(rows, has_ref, has_base)


def warnings(warned, total):
    """One line for all the rows marked ``!``, naming the worst, instead of one line each."""
    if not warned:
        return []
    lines = []
    busy = [row for row, _ in warned if row.get("busy")]
    if busy:
        share = min((row.get("cpu_share") or 1.0) for row in busy)
        load = max((row.get("load") or 0) for row in busy)
        threads = max((row.get("threads") or 1) for row in busy)
        advice = "use --autograd-bench-threads=1 or a quiet machine" if threads > 1 else "use a quiet machine"
        lines.append(f"! {len(busy)} of {total} CPU timing(s) ran on a busy machine (the timing thread ran as little "
                     f"as {share:.0%} of the time, load up to {load:.1f}): their medians include "
                     f"waiting for a core, which the IQR need not show; {advice}")
    noisy = [(row, label) for row, label in warned if row["noise"] > row["noise_target"]]
    few = [(row, label) for row, label in warned if row["stats"]["rounds"] < 5]
    parts = []
    if noisy:
        target = fmt_percent(noisy[0][0]["noise_target"])
        worst_row, worst_label = max(noisy, key=lambda pair: pair[0]["noise"])
        parts.append(f"{len(noisy)} of {total} timing(s) are noisier than the {target} target "
                     f"(worst: {worst_label}, IQR {fmt_percent(worst_row['noise'])} of the median)")
    if few:
        parts.append(f"{len(few)} ran fewer than 5 rounds")
    if parts:
        lines.append("! " + "; ".join(parts) + ": raise --autograd-bench-budget, set --autograd-bench-threads, "
                     "or quiet the machine")
    return lines


def legend(rows, has_ref, has_base):
    lines = []
    timers = sorted({row["timer"] for row in rows})
    caches = sorted({(row["device"], row["cache"]) for row in rows if row["timer"] == "cuda-events"})
    if "cuda-events" in timers:
        modes = ", ".join(f"{device} {cache} L2" for device, cache in caches)
        lines.append(f"CUDA: events around each call, one sync per batch; cache: {modes} "
                     "(cold: L2 flushed before each call, outside the timed region)")
    if any(t.startswith("perf_counter") for t in timers):
        threads = sorted({row.get("threads") for row in rows if row["timer"].startswith("perf_counter")} - {None})
        lines.append(f"CPU: wall clock around adaptive blocks of calls, {'/'.join(map(str, threads)) or '?'} torch "
                     "thread(s); caches warm")
        cores = max((row.get("cores") or 0) for row in rows)
        if threads and max(threads) > 1 and cores and max(threads) >= cores:
            lines.append(f"CPU: {max(threads)} threads on {cores} cores: any other work on the machine stalls every "
                         "parallel region; --autograd-bench-threads=1 gives steadier numbers")
    lines.append("median and IQR per call; noise = IQR / median; rounds = timed rounds; "
                 "fwd = forward, bwd = backward alone (graph replayed), fwd+bwd = both")
    if has_ref:
        lines.append("speedup = reference median / op median (above 1: the op is faster)")
    if has_base:
        lines.append("vs baseline = new median / baseline median (above 1: slower)")
    return lines
