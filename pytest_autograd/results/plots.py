"""Failure pictures: expected, got and their difference as heat maps.

The pattern of the wrong elements usually names the bug at a glance: a
mirrored band is a transposed weight gradient, the last columns a tail
tile, a whole panel a ``needs_input_grad`` slip. One PNG per failing item,
one row of panels per wrong argument or output: expected and got on one
shared colour scale, their difference on its own (an error far smaller
than the values must still show). The circle marks the element the report
names for that row (ranked as the check ranks it: error over its
tolerance, so a small error on a tiny value can outrank a larger one on a
large value); a cross marks the largest absolute difference where that is
elsewhere, and the picture says so. The numbers drawn are saved beside the
PNG (``.pt``) so a notebook or a test can read them.
"""

import re
from pathlib import Path

MAX_PANELS = 4  # rows of expected/got/difference per picture


def picture_name(nodeid):
    """A file name from an item id: ``test_ops.py::test_linear[gradcheck-cpu]`` -> ``test_ops.py-test_linear-gradcheck-cpu``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", nodeid).strip("-")
    return name[-150:] or "item"


def as_matrix(tensor, worst=None):
    """A 2-D view of ``tensor`` plus where ``worst`` lands in it, and how it was reduced (or None).

    Above two dimensions the leading ones are flattened into rows, so every
    element is still shown, each row a slice of the last dimension.
    """
    shape = tuple(tensor.shape)
    if len(shape) == 0:
        return tensor.reshape(1, 1), (0, 0) if worst is not None else None, None
    if len(shape) == 1:
        return tensor.reshape(1, -1), ((0, worst[0]) if worst else None), None
    if len(shape) == 2:
        return tensor, (tuple(worst) if worst else None), None
    rows = 1
    for size in shape[:-1]:
        rows *= size
    position = None
    if worst:
        flat_row = 0
        for index, size in zip(worst[:-1], shape[:-1]):
            flat_row = flat_row * size + index
        position = (flat_row, worst[-1])
    dims = "x".join(str(size) for size in shape[:-1])
    return tensor.reshape(rows, shape[-1]), position, f"dims {dims} flattened into rows"


def panels_of(report):
    """The data each row of the picture draws: what a test checks instead of pixels."""
    panels = []
    for evidence in report.evidence[:MAX_PANELS]:
        largest_index = _largest_difference(evidence)
        named = evidence.worst is not None
        expected, worst, reduced = as_matrix(evidence.expected, evidence.worst if named else largest_index)
        got, _, _ = as_matrix(evidence.got, worst)
        _, largest, _ = as_matrix(evidence.expected, largest_index)
        panels.append({
            "label": evidence.label,
            "kind": evidence.kind,
            "expected": expected,
            "got": got,
            "difference": got - expected,
            "worst": worst,  # circled: the element the report names
            "ranking": evidence.ranking if named else "the largest |got - expected|",
            "largest": largest if largest != worst else None,  # crossed: the largest |difference|, when elsewhere
            "reduced": reduced,
        })
    return panels


def _largest_difference(evidence):
    import torch

    from pytest_autograd.results.compare import unravel

    difference = (evidence.got - evidence.expected).abs()
    if difference.numel() == 0:
        return None
    difference = torch.where(difference.isnan(), torch.full_like(difference, float("inf")), difference)
    flat = int(torch.argmax(difference))
    return unravel(flat, difference.shape)


def save_picture(report, directory, nodeid):
    """Draw ``report``'s evidence into ``directory``; return the PNG's path (None without evidence)."""
    panels = panels_of(report)
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{picture_name(nodeid)}.png"
    figure, axes = plt.subplots(len(panels), 3, figsize=(13, 3.6 * len(panels)), squeeze=False,
                               constrained_layout=True)
    figure.suptitle(_title(report), fontsize=10)
    for row, panel in zip(axes, panels):
        _draw_row(row, panel)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    torch.save({"title": _title(report), "panels": panels}, path.with_suffix(".pt"))
    return path


def _draw_row(row, panel):
    """expected and got share one colour scale; the difference gets its own, so a small error still shows."""
    values = [panel["expected"], panel["got"], panel["difference"]]
    shared = _bound(values[:2])
    bounds = (shared, shared, _bound(values[2:]))
    names = ("expected", "got", "got - expected (own scale)")
    for axis, value, name, bound in zip(row, values, names, bounds):
        image = axis.imshow(value.numpy(), cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                            interpolation="nearest")
        what = "Jacobian (rows: outputs, columns: inputs)" if panel["kind"] == "jacobian" else ""
        axis.set_title(f"{panel['label']}: {name}" + (f"\n{what}" if what else ""), fontsize=9)
        if panel["reduced"]:
            axis.set_xlabel(panel["reduced"], fontsize=8)
        if panel["worst"] is not None:
            r, c = panel["worst"]
            axis.plot([c], [r], marker="o", markersize=12, markerfacecolor="none", markeredgecolor="black",
                      markeredgewidth=1.8)
        if panel["largest"] is not None:
            r, c = panel["largest"]
            axis.plot([c], [r], marker="x", markersize=10, color="black", markeredgewidth=1.5)
        axis.figure.colorbar(image, ax=axis, shrink=0.85)
    row[0].set_ylabel(_legend(panel), fontsize=7)


def _legend(panel):
    """What the marks mean, in the row's margin."""
    text = f"circle: the element the report names,\n{_wrapped(panel['ranking'])}"
    if panel["largest"] is not None:
        text += "\ncross: the largest |got - expected|"
    return text


def _wrapped(text, width=48):
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _bound(values):
    finite = [v[v.isfinite()] for v in values]
    return max([float(v.abs().max()) for v in finite if v.numel()] + [1e-30])


def _title(report):
    parts = [f"check: {report.check}"]
    for label, value in (("device", report.device), ("dtype", report.dtype), ("sample", report.sample),
                         ("argument", report.argument), ("output", report.output)):
        if value is not None:
            parts.append(f"{label}: {value}")
    drawn = "" if len(report.evidence) <= MAX_PANELS else f" (the first {MAX_PANELS} of {len(report.evidence)} drawn)"
    return f"{report.summary}{drawn}\n{', '.join(parts)}"
