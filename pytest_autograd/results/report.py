"""Failure reports: what a person who did not write the check needs to read.

The order follows the design: check, device, dtype, sample; output and
argument; worst element; error against tolerance; hint; seed; rerun command.
"""

from dataclasses import dataclass, field, fields


@dataclass
class Report:
    check: str
    summary: str
    device: str = None
    dtype: str = None
    sample: int = None
    output: str = None
    argument: str = None
    worst: str = None
    error: str = None
    hint: str = None
    details: list = field(default_factory=list)
    seed: int = None
    rerun: str = None
    nodeid: str = None
    picture: str = None  # path of the failure picture, with --autograd-plots
    # Tensors behind the failure (pytest_autograd.results.evidence.Evidence), for pictures; never rendered as text.
    evidence: list = field(default_factory=list, repr=False, compare=False)

    def render(self):
        where = [f"check {self.check}"]
        for label, value in (("device", self.device), ("dtype", self.dtype), ("sample", self.sample)):
            if value is not None:
                where.append(f"{label} {value}")
        lines = [f"{self.summary}", "  " + ", ".join(where)]
        if self.output is not None or self.argument is not None:
            parts = []
            if self.output is not None:
                parts.append(f"output: {self.output}")
            if self.argument is not None:
                parts.append(f"argument: {self.argument}")
            lines.append("  " + ", ".join(parts))
        if self.worst:
            lines.append(f"  worst element: {self.worst}")
        if self.error:
            lines.append(f"  {self.error}")
        lines.extend(f"  {detail}" for detail in self.details)
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        if self.seed is not None:
            lines.append(f"  seed: {self.seed}")
        if self.rerun:
            lines.append(f"  rerun: {self.rerun}")
        return "\n".join(lines)

    def to_dict(self):
        """The report's text fields, for JSON records (the evidence tensors stay out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "evidence"}


class CheckFailure(AssertionError):
    """Raised by a check; carries the Report the plugin renders."""

    def __init__(self, report):
        super().__init__(report.summary)
        self.report = report

    def __str__(self):
        return self.report.render()
