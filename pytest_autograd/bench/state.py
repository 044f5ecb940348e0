"""The bench session's state, which the bench check reads: settings, baselines and the rows collected.

No pytest here: the adapter (``pytest_autograd.pytest_adapter.bench``) builds it from the options and
hands it to the engine in ``RunOptions.bench``; items are only read (node id, name, test function).
"""

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

from pytest_autograd.bench.config import BadSetting, TimerConfig

PROPERTY = "autograd_bench"
GROUP_PREFIX = "autograd-bench-"
OFF_REASON = "benchmarks are off: pass --autograd-bench to time this op"


@dataclass
class BenchState:
    """Settings of this run plus what it collected."""

    enabled: bool = False
    only: bool = False
    timer: TimerConfig = field(default_factory=TimerConfig)
    json_path: Path = None
    save: str = None
    compare: str = None
    fail_rules: list = None
    plot_dir: Path = None
    root: Path = Path(".")
    rows: list = field(default_factory=list)
    machine: dict = None
    notes: list = field(default_factory=list)
    current_item: object = None
    _baselines: dict = field(default_factory=dict)

    def baseline(self, name):
        """The saved entries of baseline ``name`` (None when it does not exist yet), read once."""
        from pytest_autograd.bench.results import baseline_path, load_baseline

        if name not in self._baselines:
            self._baselines[name] = load_baseline(baseline_path(self.root, name))
        return self._baselines[name]

    def compare_rows(self, rows):
        """Annotate rows with the baseline; return regression lines (empty: none or no comparison)."""
        if not self.compare:
            return []
        from pytest_autograd.bench.results import compare

        return compare(rows, self.baseline(self.compare), self.fail_rules, self.compare)

    def record(self, item, rows, machine):
        """Attach rows to the item's report, whence they reach the summary (also from xdist workers)."""
        if item is None:
            self.rows.extend(rows)
            self.machine = self.machine or machine
            return
        item.user_properties.append((PROPERTY, json.dumps({"rows": rows, "machine": machine}, default=str)))


def stable_nodeid(item):
    """The item's nodeid without xdist's ``@group`` suffix, so baselines match with and without xdist."""
    nodeid = item.nodeid
    for mark in item.iter_markers("xdist_group"):
        name = mark.args[0] if mark.args else mark.kwargs.get("name", "default")
        suffix = f"@{name}"
        if nodeid.endswith(suffix):
            nodeid = nodeid[: -len(suffix)]
    return nodeid


def sweep_parameter(item, explicit):
    """The test parameter a sweep size goes to: ``sweep_arg=`` or the first one with a default."""
    try:
        parameters = inspect.signature(item.obj).parameters
    except (TypeError, ValueError, AttributeError):
        parameters = {}
    if explicit is not None:
        if parameters and explicit not in parameters:
            raise BadSetting(f"{item.nodeid}: sweep_arg={explicit!r} is not a parameter of {item.name}; "
                             f"its parameters are: {', '.join(parameters) or 'none'}")
        return explicit
    for name, parameter in parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            return name
    raise BadSetting(f"{item.nodeid}: sweep= needs a test parameter with a default to receive the size, e.g. "
                     "`def test_linear(size=256): ...`, or name one with sweep_arg=\"size\"")
