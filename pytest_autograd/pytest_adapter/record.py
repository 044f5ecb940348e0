"""The JSON record: one entry per generated item, for CI dashboards and the next run.

Workers (xdist or not) attach what only they know (seed, rerun command,
the structured failure) to the report's ``user_properties`` as a JSON
string; the controller folds the phases of each item into one record and
writes the file once. The schema is versioned; see docs/json_record.md.
"""

import json
import os
from dataclasses import dataclass, field

SCHEMA = "pytest-autograd/record"
SCHEMA_VERSION = 1
PROPERTY = "autograd_record"
FAILURE_FIELDS = ("summary", "device", "dtype", "sample", "output", "argument", "worst", "error", "hint",
                  "details", "picture", "shrunk", "repro", "also")


def without_group(nodeid):
    """The node id without the ``@group`` suffix pytest-xdist adds under ``--dist loadgroup``."""
    head, at, tail = nodeid.rpartition("@")
    return head if at and not any(char in tail for char in "[]/:") else nodeid


def test_name(nodeid, spec_id):
    """The test an item belongs to: its node id without the ``check-device`` part of the parameters.

    ``t.py::test_x[gradcheck-cpu]`` -> ``t.py::test_x``; ``t.py::test_x[gradcheck-cpu-4]`` -> ``t.py::test_x[4]``.
    """
    nodeid = without_group(nodeid)
    if not nodeid.endswith("]") or "[" not in nodeid:
        return nodeid
    base, _, params = nodeid[:-1].partition("[")
    parts = params.split("-")
    size = len(spec_id.split("-"))
    for start in range(len(parts) - size + 1):
        if "-".join(parts[start:start + size]) == spec_id:
            rest = parts[:start] + parts[start + size:]
            return f"{base}[{'-'.join(rest)}]" if rest else base
    return nodeid


def worker_fields(test, seed, rerun, report=None, notes=()):
    """What the process that ran the item adds to its record, as a JSON string."""
    failure = None
    if report is not None:
        failure = {name: value for name, value in report.to_dict().items() if name in FAILURE_FIELDS}
        failure["strategy"] = _strategy(report.error)
        failure.update(_worst_parts(report.worst))
        failure["abs_error"] = _number_after(report.error, ("abs error", "max abs error"))
        failure["tolerance"] = _number_after(report.error, ("tolerance",))
    return json.dumps({"test": test, "seed": seed, "rerun": rerun, "failure": failure, "notes": list(notes)},
                      default=str)


@dataclass(eq=False)  # registered as a pytest plugin: pytest < 8 keeps plugins in sets, so it must stay hashable
class Recorder:
    """Folds each item's phase reports into one record; writes them all at the end (controller only)."""

    path: str
    records: dict = field(default_factory=dict)

    def pytest_runtest_logreport(self, report):
        properties = dict(report.user_properties)
        key = properties.get("autograd")
        if key is None:
            return
        check, device = key.split("|", 1)
        record = self.records.setdefault(report.nodeid, {
            "nodeid": report.nodeid, "test": report.nodeid, "check": check, "device": device, "dtype": None,
            "outcome": "passed", "duration": 0.0, "seed": None, "rerun": None, "reason": None, "failure": None,
            "notes": [],
        })
        record["duration"] = round(record["duration"] + float(getattr(report, "duration", 0.0) or 0.0), 6)
        extra = properties.get(PROPERTY)
        if extra:
            fields = json.loads(extra)
            record.update({name: fields[name] for name in ("test", "seed", "rerun", "notes")})
            if fields.get("failure"):
                record["failure"] = fields["failure"]
                record["dtype"] = fields["failure"].get("dtype")
        outcome = _outcome(report)
        if outcome is not None and _RANK[outcome] >= _RANK[record["outcome"]]:
            record["outcome"] = outcome
            if outcome in ("skipped", "xfailed"):
                record["reason"] = _reason(report)

    def write(self):
        document = {"schema": SCHEMA, "version": SCHEMA_VERSION, "records": list(self.records.values())}
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, default=str)
        os.replace(temporary, self.path)


_RANK = {"passed": 0, "xpassed": 1, "skipped": 1, "xfailed": 2, "failed": 3, "error": 4}


def _outcome(report):
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when != "call" and report.failed:
        return "error"
    if report.when == "call" or not report.passed:
        return report.outcome
    return None


def _reason(report):
    if hasattr(report, "wasxfail"):
        return report.wasxfail or None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).replace("Skipped: ", "", 1)
    return str(longrepr) if longrepr else None


def _strategy(error_line):
    """The strategy named in parentheses at the end of an error line, e.g. ``full Jacobian``."""
    if not error_line or not error_line.endswith(")") or "(" not in error_line:
        return None
    return error_line[error_line.rindex("(") + 1: -1]


def _number_after(error_line, labels):
    """The number that follows the first of ``labels`` found in ``error_line`` (None if absent)."""
    for label in labels:
        if error_line and f"{label} " in error_line:
            text = error_line.split(f"{label} ", 1)[1].split()[0].strip("(),;")
            try:
                return float(text)
            except ValueError:
                return None
    return None


def _worst_parts(worst):
    """``expected`` and ``got`` as numbers from a worst-element line, where it has them."""
    parts = {"expected": None, "got": None}
    if not worst or "expected " not in worst or "got " not in worst:
        return parts
    for name in parts:
        text = worst.split(f"{name} ", 1)[1].split()[0].strip(",()")
        try:
            parts[name] = float(text)
        except ValueError:
            parts[name] = text
    return parts
