"""One PNG per swept op: time and throughput against size, op and reference on the same axes.

matplotlib is an optional extra (``pip install pytest-autograd[plot]``) and
is imported only here, only when ``--autograd-bench-plot`` is given.
"""

import re
from pathlib import Path

from pytest_autograd.bench.results import SHORT
from pytest_autograd.bench.table import sort_rows

_COLOURS = {"forward": "tab:blue", "backward": "tab:orange", "forward+backward": "tab:green"}


def _filename(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:150] or "bench"


def groups(rows):
    """(test, label, dtype, sample) -> rows, for tests that ran at two or more sizes."""
    found = {}
    for row in sort_rows(rows):
        if row.get("size") is None:
            continue
        found.setdefault((row["test_name"], row.get("label"), row.get("dtype"), row.get("sample") or 0), []).append(row)
    return {key: value for key, value in found.items() if len({r["size"] for r in value}) >= 2}


def write_plots(rows, directory):
    """Write the PNGs; returns (paths, problem) where problem explains a skipped plot run."""
    selected = groups(rows)
    if not selected:
        return [], "no swept benchmark (sweep=[...] on the marker) ran at two or more sizes: nothing to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed: pip install 'pytest-autograd[plot]' to get plots"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for (test, label, dtype, sample), chosen in selected.items():
        figure, (time_axes, rate_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
        numeric = all(isinstance(r["size"], (int, float)) for r in chosen)
        use_flops = any(r.get("tflops") for r in chosen)
        for (impl, direction), line in _lines(chosen).items():
            sizes = [r["size"] if numeric else str(r["size"]) for r in line]
            style = "-" if impl == "op" else "--"
            name = f"{line[0]['impl_name']} {SHORT[direction]}" + ("" if impl == "op" else " (reference)")
            colour = _COLOURS.get(direction)
            time_axes.plot(sizes, [r["stats"]["median"] * 1e3 for r in line], style, marker="o", color=colour,
                           label=name)
            rates = [r.get("tflops") if use_flops else r.get("gbps") for r in line]
            rate_axes.plot(sizes, [float("nan") if v is None else v for v in rates], style, marker="o",
                           color=colour, label=name)
        for axes in (time_axes, rate_axes):
            if numeric:
                axes.set_xscale("log", base=2)
            axes.set_xlabel("size")
            axes.grid(True, which="both", alpha=0.3)
        time_axes.set_yscale("log")
        time_axes.set_ylabel("median time per call (ms)")
        rate_axes.set_ylabel("TFLOP/s" if use_flops else "GB/s (ideal traffic)")
        time_axes.legend(fontsize=8)
        device = chosen[0]["device"]
        title = f"{test}{'::' + label if label else ''}  {device} {dtype or ''}"
        figure.suptitle(title)
        figure.tight_layout()
        parts = [test, label, dtype, f"sample{sample}" if sample else None]
        path = directory / (_filename("-".join(str(p) for p in parts if p)) + ".png")
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths, None


def _lines(rows):
    lines = {}
    for row in rows:
        lines.setdefault((row["impl"], row["direction"]), []).append(row)
    return lines
