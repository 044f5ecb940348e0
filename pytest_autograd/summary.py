"""The end-of-session table: one row per check, one column per device."""

import pytest


class Tally:
    """Counts outcomes of generated items from their reports (works under xdist)."""

    def __init__(self, order=()):
        self.counts = {}  # (check, device) -> {outcome: n}
        self.order = list(order)  # registry order, so rows read the same under xdist
        self.absent = {}  # device -> reason, for devices asked for but not available
        self.notes = []  # (nodeid, note) from checks that passed or skipped with something to say

    def pytest_runtest_logreport(self, report):
        key = dict(report.user_properties).get("autograd")
        if key is None:
            return
        if report.when == "call":
            self.notes.extend((report.nodeid, text) for name, text in report.user_properties if name == "autograd_note")
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            check, device = key.split("|", 1)
            if report.skipped and isinstance(report.longrepr, tuple) and "was asked for but" in str(report.longrepr[2]):
                self.absent.setdefault(device, str(report.longrepr[2]).replace("Skipped: ", ""))
            outcome = report.outcome
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
        terminalreporter.section("autograd checks")
        write("  ".join(["check".ljust(width)] + [d.ljust(w) for d, w in zip(devices, columns)]))
        for check in checks:
            row = [check.ljust(width)] + [cells.get((check, d), "-").ljust(w) for d, w in zip(devices, columns)]
            write("  ".join(row).rstrip())
        for nodeid, text in self.notes:
            write(f"note: {nodeid}: {text}")
        for device, reason in self.absent.items():
            terminalreporter.write_line(f"warning: {reason}: none of its items ran", yellow=True, bold=True)

    @staticmethod
    def _cell(per):
        order = ("passed", "failed", "skipped")
        return " ".join(f"{per[o]} {o}" for o in order if per.get(o))
