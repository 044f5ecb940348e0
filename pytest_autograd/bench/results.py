"""Rows, pytest-benchmark JSON, baselines and the regression comparison.

A row is one timing (implementation x direction at one op/device/dtype/size)
as a plain JSON-able dict, so rows travel from xdist workers to the
controller inside report ``user_properties``. Files use pytest-benchmark's
schema (``machine_info``, ``commit_info``, ``benchmarks`` with ``stats`` and
``extra_info``) so its ``compare`` tooling and dashboards read them. No torch
and never pickle.
"""

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

from pytest_autograd.bench.stats import Stats, fmt_percent, fmt_time

SCHEMA_VERSION = "5.1.0"  # the pytest-benchmark JSON layout these files follow
BASELINE_DIR = ".autograd_bench"
SHORT = {"forward": "fwd", "backward": "bwd", "forward+backward": "fwd+bwd"}


class BaselineProblem(Exception):
    """A baseline file that cannot be read; the message names the file and the fix."""


def row_key(row):
    parts = [row["test"]]
    if row.get("label"):
        parts.append(row["label"])
    parts += [row["impl"], row["direction"], row.get("dtype") or "-"]
    if row.get("size") is not None:
        parts.append(f"size={row['size']}")
    if row.get("sample"):
        parts.append(f"sample={row['sample']}")
    return "::".join(parts)


def make_rows(result, test, test_name, label=None, size=None, sample=0):
    """One row per implementation and direction of a BenchResult."""
    rows = []
    timings = [result.op] + ([result.reference] if result.reference is not None else [])
    for timing in timings:
        for direction, measurement in timing.measurements.items():
            tflops, gbps, intensity = timing.rates(direction)
            speedup = result.speedup(direction) if timing.impl == "op" else None
            row = {
                "test": test,
                "test_name": test_name,
                "label": label,
                "op": result.op.name,
                "impl": timing.impl,
                "impl_name": timing.name,
                "device": result.device,
                "dtype": result.dtype,
                "direction": direction,
                "size": size,
                "sample": sample,
                "stats": measurement.stats.as_dict(include_data=True),
                "timer": measurement.timer,
                "cache": measurement.cache,
                "stop": measurement.stop,
                "noise": measurement.noise,
                "noise_target": measurement.noise_target,
                "calls_per_round": measurement.block,
                "warmup_calls": measurement.warmup_calls,
                "first_call_s": measurement.first_call,
                "threads": measurement.threads,
                "load": measurement.load,
                "cpu_share": measurement.cpu_share,
                "cores": measurement.cores,
                "busy": measurement.busy,
                "flops": timing.flops.get(direction),
                "bytes": timing.bytes.get(direction),
                "tflops": tflops,
                "gbps": gbps,
                "intensity": intensity,
                "speedup": speedup,
                "notes": list(timing.notes),
                "warning": measurement.warning(),
            }
            row["key"] = row_key(row)
            rows.append(row)
    return rows


# -- pytest-benchmark JSON -------------------------------------------------------------

_EXTRA = ("op", "impl", "impl_name", "device", "dtype", "direction", "size", "sample", "timer", "cache", "stop",
          "noise", "noise_target", "calls_per_round", "warmup_calls", "first_call_s", "threads", "load",
          "cores", "cpu_share", "busy", "flops", "bytes", "tflops", "gbps", "intensity", "speedup", "notes", "warning",
          "baseline")


def benchmark_entry(row):
    """One ``benchmarks`` item of pytest-benchmark's JSON."""
    params = {name: row.get(name) for name in ("impl", "direction", "device", "dtype", "size", "sample")}
    param = "-".join(str(v) for v in (row["impl"], row["direction"], row.get("dtype"), row.get("size"))
                     if v is not None)
    name = "::".join(p for p in (row["test_name"], row.get("label"), row["impl"], row["direction"],
                                 row.get("dtype"), None if row.get("size") is None else f"size={row['size']}") if p)
    return {
        "group": row["test_name"] + (f"::{row['label']}" if row.get("label") else ""),
        "name": name,
        "fullname": row["key"],
        "params": params,
        "param": param,
        "extra_info": {k: row.get(k) for k in _EXTRA if row.get(k) is not None},
        "options": {"timer": row["timer"], "noise_target": row["noise_target"], "cache": row["cache"],
                    "calls_per_round": row["calls_per_round"], "disable_gc": True, "warmup": True},
        "stats": row["stats"],
    }


def python_machine_info(machine=None):
    """pytest-benchmark's ``machine_info`` keys plus what GPU people need (torch, CUDA, GPU, threads)."""
    machine = dict(machine or {})
    info = {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {"brand_raw": machine.get("cpu") or platform.processor(), "count": machine.get("cores")},
    }
    for key in ("torch", "cuda", "gpu", "threads"):
        info[key] = machine.get(key)
    return info


def commit_info(root):
    """Git commit of ``root`` (id, branch, dirty), or nulls outside a repository."""
    info = {"id": None, "time": None, "author_time": None, "dirty": False, "project": Path(root).name,
            "branch": None}

    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        info["id"] = git("rev-parse", "HEAD")
        info["branch"] = git("rev-parse", "--abbrev-ref", "HEAD")
        info["time"] = git("log", "-1", "--format=%cI")
        info["author_time"] = git("log", "-1", "--format=%aI")
        status = git("status", "--porcelain", "--untracked-files=no")
        info["dirty"] = bool(status)
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def document(rows, machine=None, root="."):
    return {
        "machine_info": python_machine_info(machine),
        "commit_info": commit_info(root),
        "benchmarks": [benchmark_entry(row) for row in rows],
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": SCHEMA_VERSION,
    }


def write_json(path, rows, machine=None, root=".", merge=False):
    """Write ``rows`` to ``path``; with ``merge``, keep the file's other benchmarks."""
    path = Path(path)
    doc = document(rows, machine, root)
    if merge and path.exists():
        old = read_json(path)
        fresh = {entry["fullname"] for entry in doc["benchmarks"]}
        kept = [entry for entry in old.get("benchmarks", []) if entry.get("fullname") not in fresh]
        doc["benchmarks"] = kept + doc["benchmarks"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str))
    tmp.replace(path)
    return path


def read_json(path):
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise BaselineProblem(f"{path} is not valid JSON ({error}); delete it or save it again with "
                              "--autograd-bench-save=NAME") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise BaselineProblem(f"{path} is not a benchmark file (no 'benchmarks' list); save it again with "
                              "--autograd-bench-save=NAME")
    return doc


# -- baselines ---------------------------------------------------------------------------

def baseline_path(root, name):
    return Path(root) / BASELINE_DIR / f"{name}.json"


def load_baseline(path):
    """fullname -> saved entry; {} when the file does not exist yet."""
    path = Path(path)
    if not path.exists():
        return None
    return {entry.get("fullname"): entry for entry in read_json(path)["benchmarks"]}


def compare(rows, baseline, rules, name):
    """Annotate rows with their baseline; return the lines describing the op's regressions.

    ``baseline`` None (no file) or lacking a row marks the row
    ``baseline_missing``: the plugin saves it at the end, with a note.
    """
    lines = []
    for row in rows:
        entry = (baseline or {}).get(row["key"])
        if entry is None:
            row["baseline_missing"] = True
            continue
        old = Stats.from_dict(entry.get("stats", {}))
        new = Stats.from_dict(row["stats"])
        ratio = new.median / old.median if old.median else None
        row["baseline"] = {"name": name, "median": old.median, "noise": old.noise, "ratio": ratio}
        if row["impl"] != "op":
            continue  # the reference is the yardstick: shown, never failed
        for rule in rules or []:
            old_value, new_value = getattr(old, rule.field, None), getattr(new, rule.field, None)
            if not rule.exceeded(old_value, new_value):
                continue
            row["regressed"] = True
            lines.append(regression_line(row, rule, old_value, new_value, old.noise, new.noise))
    return lines


def regression_line(row, rule, old, new, old_noise, new_noise):
    where = ", ".join(str(p) for p in (row["device"], row.get("dtype"),
                                        None if row.get("size") is None else f"size={row['size']}",
                                        f"sample {row['sample']}" if row.get("sample") else None) if p)
    ratio = new / old if old else float("inf")
    line = (f"{row['direction']} ({where}): {rule.field} old {fmt_time(old)} -> new {fmt_time(new)}, "
            f"ratio {ratio:.2f}x, limit {rule.describe()}; noise old {fmt_percent(old_noise)}, "
            f"new {fmt_percent(new_noise)}")
    if abs(ratio - 1) <= (old_noise or 0) + (new_noise or 0):
        line += " (the change is within the measured noise: a longer --autograd-bench-budget would tell)"
    return line
