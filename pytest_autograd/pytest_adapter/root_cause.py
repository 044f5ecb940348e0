"""One full report per root cause.

An op whose forward or backward raises (or crashes the process) on the
user's own sample, a reference that raises, or a test body whose samples are
unusable makes every check of the test fail for the
same reason. The first item of a test and device that meets a cause shows
the full report; every other item of that test and device that meets the
same cause fails with one line pointing at it.

The record is per process (each xdist worker shows the full report once),
and an item always runs its own check: an item that meets no cause passes,
and a rerun of the item that showed the full report (``--reruns``, ``--lf``)
shows it again rather than pointing at itself, so no rerun turns a failure
into a pass or a skip. An expected failure (``xfail``) never becomes the
item others point at, since its report is not shown.
"""

import re

import pytest

CAUSES = pytest.StashKey()

_OP_RAISED = re.compile(r"^the op's (?P<phase>\w+) raised (?P<error>[\w.]+)[^:\n]*: (?P<message>.*)$", re.S)
_REFERENCE_RAISED = re.compile(r"^reference=.* raised ", re.S)
# a crash on the user's own sample (engine.exploration.crashes) is every check's, as an error raised there is
_CRASHED_ON_SAMPLE = re.compile(r"^`[^`]+` crashed the process \((?P<signal>[^)]*)\) on your sample: (?P<rest>.*)$",
                                re.S)


def cause_of_failure(summary):
    """The cause a failure's summary names when it is one every check shares, else None."""
    raised = _OP_RAISED.match(summary)
    if raised:
        return ("op raised", raised.group("phase"), raised.group("error"), raised.group("message"))
    if _REFERENCE_RAISED.match(summary):
        return ("reference raised", summary)
    crashed = _CRASHED_ON_SAMPLE.match(summary)
    if crashed:
        return ("crashed on the sample", crashed.group("signal"), crashed.group("rest"))
    return None


def cause_of_usage_problem(text, nodeid):
    """A usage problem is the same cause for every item when only the item's id differs."""
    return ("usage", text.replace(nodeid, "<item>"))


def _test_key(item, spec):
    callspec = getattr(item, "callspec", None)
    params = {} if callspec is None else {k: v for k, v in callspec.params.items() if not k.startswith("_autograd")}
    parent = item.parent.nodeid if item.parent is not None else ""
    return (parent, getattr(item, "originalname", item.name), repr(sorted(params.items(), key=str)),
            getattr(spec, "marker", 0), spec.device)


def pointer_to_first(item, spec, cause, headline):
    """None when ``item`` shows the full report; else the one line pointing at the item that did."""
    if cause is None or any(True for _ in item.iter_markers("xfail")):
        return None
    causes = item.config.stash.setdefault(CAUSES, {})
    first = causes.setdefault((_test_key(item, spec), cause), item.nodeid)
    if first == item.nodeid:
        return None
    headline = headline.strip().splitlines()[0] if headline.strip() else "the same failure"
    return f"{headline} (same cause as {first}: see its full report)"
