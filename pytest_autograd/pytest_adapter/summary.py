"""The end-of-session table: one row per check, one column per device, then what failed per test."""

import pytest

MAX_FAILED_TESTS = 50  # lines listing failing tests; the rest are counted


CRASHED = "crashed while running"


def _explain_crash(report, properties):
    """Name the op and the check in pytest-xdist's report of a worker that died running an item."""
    if not isinstance(report.longrepr, str) or CRASHED not in report.longrepr:
        return
    check, device = properties["autograd"].split("|", 1)
    op = properties.get("autograd_op", "the op")
    report.longrepr = (f"{op} crashed the Python process during check {check} on {device}: a segfault or abort in "
                       "its C++/CUDA/Triton code (the worker's 'Fatal Python error' lines above show where). "
                       "pytest-xdist started a new worker and the session went on. --autograd-isolate=all runs "
                       "every check in a sandbox process, where such a crash is reported as the check's failure, "
                       "naming the input, without pytest-xdist.\n" + report.longrepr)


def _end_progress_line(terminalreporter):
    """Start the table on a fresh line without a blank one: the progress line may already have ended while the
    reporter still remembers its file (then its write_line would insert an empty line first)."""
    if getattr(getattr(terminalreporter, "_tw", None), "width_of_current_line", 0):
        terminalreporter.write("\n")
    terminalreporter.currentfspath = None


class Tally:
    """Counts outcomes of generated items from their reports (works under xdist)."""

    def __init__(self, order=()):
        self.counts = {}  # (check, device) -> {outcome: n}
        self.order = list(order)  # registry order, so rows read the same under xdist
        self.absent = {}  # device -> reason, for devices asked for but not available
        self.failed = {}  # test -> [check-device, ...] of its failed items, in order
        self.notes = []  # (nodeid, note) from checks that passed or skipped with something to say
        self.started = {}  # nodeid -> its setup report's properties (check, device, op), for a worker that dies

    def pytest_runtest_logreport(self, report):
        properties = dict(report.user_properties)
        key = properties.get("autograd")
        if report.when == "setup" and key is not None:
            self.started[report.nodeid] = properties
        crashed = key is None and report.failed and report.nodeid in self.started
        if crashed:
            key = self.started[report.nodeid]["autograd"]
            _explain_crash(report, self.started[report.nodeid])
        if key is None:
            return
        if report.when == "call":
            self.notes.extend((report.nodeid, text) for name, text in report.user_properties if name == "autograd_note")
        if report.when == "call" or crashed or (report.when == "setup" and report.outcome != "passed"):
            check, device = key.split("|", 1)
            if report.skipped and isinstance(report.longrepr, tuple) and "was asked for but" in str(report.longrepr[2]):
                self.absent.setdefault(device, str(report.longrepr[2]).replace("Skipped: ", ""))
            outcome = report.outcome
            if report.failed:
                from pytest_autograd.pytest_adapter.record import test_name  # only once an item failed

                item_id = f"{check}-{device}"
                self.failed.setdefault(test_name(report.nodeid, item_id), []).append(item_id)
            per = self.counts.setdefault((check, device), {})
            per[outcome] = per.get(outcome, 0) + 1

    def __bool__(self):
        return bool(self.counts)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        if not self.counts:
            return
        seen = list(dict.fromkeys(check for check, _ in self.counts))
        checks = [c for c in self.order if c in seen] + [c for c in seen if c not in self.order]
        devices = list(dict.fromkeys(device for _, device in self.counts))
        cells = {key: self._cell(per) for key, per in self.counts.items()}
        width = max(len(check) for check in checks + ["check"])
        columns = [max([len(device)] + [len(cells.get((c, device), "-")) for c in checks]) for device in devices]
        write = terminalreporter.write_line
        _end_progress_line(terminalreporter)

        terminalreporter.section("autograd checks")
        write("  ".join(["check".ljust(width)] + [d.ljust(w) for d, w in zip(devices, columns)]))
        for check in checks:
            row = [check.ljust(width)] + [cells.get((check, d), "-").ljust(w) for d, w in zip(devices, columns)]
            write("  ".join(row).rstrip())
        if self.notes:
            items = len({nodeid for nodeid, _ in self.notes})
            write(f"{len(self.notes)} note(s) on {items} item(s), not failures: in the warnings summary (AutogradNote, "
                  "at each test's line), the items' report sections (-rP) and --autograd-json")
        self._write_failed(write)
        for device, reason in self.absent.items():
            write(f"warning: {reason}: none of its items ran (--autograd-require-devices makes an absent device an "
                  "error)", yellow=True, bold=True)

    def _write_failed(self, write):
        """Which op is broken, without scrolling through the reports: one line per failing test."""
        if not self.failed:
            return
        write("")
        write("failed items, by test:")
        width = min(60, max(len(test) for test in self.failed))
        for test, items in list(self.failed.items())[:MAX_FAILED_TESTS]:
            write(f"  {test.ljust(width)}  {', '.join(dict.fromkeys(items))}")
        hidden = len(self.failed) - MAX_FAILED_TESTS
        if hidden > 0:
            write(f"  ... and {hidden} more failing tests")

    @staticmethod
    def _cell(per):
        order = ("passed", "failed", "skipped")
        return " ".join(f"{per[o]} {o}" for o in order if per.get(o))
