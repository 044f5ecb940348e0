"""Failure reports: what a person who did not write the check needs to read.

The order follows the design: check, device, dtype, sample; output and
argument; worst element; error against tolerance; hint; seed; rerun command;
then what follows the failure: the shrunk sample, the reproducing script.
"""

from dataclasses import dataclass, field, fields


class Hint(str):
    """A hint's text, with what it blames in words that stay the same whatever the sample's size, so that a failure
    can be told from another without its wording (engine/shrink.py): ``cause``, the pattern's factor ("twice";
    None: values differ, no factor known), and ``confined``, whether it blames a part of an argument (a column, a
    row, one element; a smaller sample may make that part the whole argument) rather than every element."""

    def __new__(cls, text, cause=None, confined=False):
        made = super().__new__(cls, text)
        made.cause, made.confined = cause, confined
        return made

    def __reduce__(self):
        return Hint, (str(self), self.cause, self.confined)


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
    # The smallest sample found that still fails the same way (engine/shrink.py): {"shapes", "original",
    # "worst", "seconds", "complete"}; None when nothing smaller reproduces or shrinking is off.
    shrunk: dict = None
    repro: str = None  # path of the stand-alone script that reproduces the failure, with --autograd-repro
    # Tensors behind the failure (pytest_autograd.results.evidence.Evidence), for pictures; never rendered as text.
    evidence: list = field(default_factory=list, repr=False, compare=False)
    # Where the numbers come from (checks/_loci.py), for the reproducing script; never rendered as text.
    locus: dict = field(default=None, repr=False, compare=False)
    # The other wrong arguments or outputs, each {"argument", "output", "worst", "locus"}; rendered through
    # ``details`` ("also ..." lines), kept here so a shrunk sample can be matched argument by argument.
    also: list = field(default_factory=list, repr=False, compare=False)

    def wrong(self):
        """Every wrong (argument, output) the report names, its own first."""
        return [(self.argument, self.output)] + [(entry.get("argument"), entry.get("output")) for entry in self.also]

    def about(self, argument, output):
        """(worst element line, locus) of the named wrong argument or output; None if the report does not name it."""
        if (self.argument, self.output) == (argument, output) or (argument is not None and self.argument == argument):
            return self.worst, self.locus
        for entry in self.also:
            if (entry.get("argument"), entry.get("output")) == (argument, output) or \
                    (argument is not None and entry.get("argument") == argument):
                return entry.get("worst"), entry.get("locus")
        return None

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
        if self.shrunk:
            lines.extend(f"  {line}" for line in shrunk_lines(self.shrunk))
        if self.repro:
            lines.append(f"  repro: python {self.repro}")
        return "\n".join(lines)

    def to_dict(self):
        """The report's text fields, for JSON records (the evidence tensors and the locus stay out)."""
        found = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("evidence", "locus", "also")}
        found["also"] = [{key: entry.get(key) for key in ("argument", "output", "worst")} for entry in self.also]
        return found


def shape_text(shape):
    """``(64, 512)``, ``(3,)``, ``()``: a shape as Python writes a tuple."""
    shape = tuple(shape)
    return f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(str(size) for size in shape) + ")"


def shapes_text(shapes):
    return ", ".join(f"{name}: {shape_text(shape)}" for name, shape in shapes.items())


def shrunk_lines(shrunk):
    """The report's lines for a shrunk sample: its shapes next to the original ones, and its worst element."""
    changed = [name for name in shrunk["shapes"] if tuple(shrunk["shapes"][name]) != tuple(shrunk["original"][name])]
    now = {name: shrunk["shapes"][name] for name in changed}
    before = {name: shrunk["original"][name] for name in changed}
    lines = [f"shrunk: reproduces at {shapes_text(now) or 'the same sizes, simpler values'}"
             + (f" instead of {shapes_text(before)}" if before else "")
             + (f" ({shrunk['note']})" if shrunk.get("note") else "")]
    if shrunk.get("headline"):
        lines.append(f"  there: {shrunk['headline']}")
    if shrunk.get("values"):
        lines.append(f"  values there: {shrunk['values']}")
    if shrunk.get("worst"):
        lines.append(f"  worst element there: {shrunk['worst']}")
    return lines


class CheckFailure(AssertionError):
    """Raised by a check; carries the Report the plugin renders."""

    def __init__(self, report):
        super().__init__(report.summary)
        self.report = report

    def __reduce__(self):  # rebuilt from its report, not from the summary it passes to AssertionError
        return CheckFailure, (self.report,)

    def __str__(self):
        return self.report.render()
