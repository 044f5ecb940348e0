"""Markers that would leave an op unchecked, reported on the test that carries them.

A plugin loaded in every project of an environment must never stop a
session over a marker: the project's own markers (``autograd``,
``autograd_slow``, ... registered in ``markers`` or with
``config.addinivalue_line``) are never an error. Only an unregistered name
within two typos of ``autograd_op`` (or ``autograd...`` given ``op=``) or of
``autograd_model`` is reported, as a failure of the tests that carry it when
they run, so deselected tests (``-k``, ``-m``) never see it. Either marker on
a ``unittest.TestCase`` method, which pytest never parametrizes, is refused
the same way.
"""

import re

import pytest

MARKER = "autograd_op"
MODEL_MARKER = "autograd_model"
REGISTERED = pytest.StashKey()


def registered_markers(config):
    names = config.stash.get(REGISTERED, None)
    if names is None:
        names = {re.split(r"[(:\s]", line.strip(), maxsplit=1)[0] for line in config.getini("markers")}
        config.stash[REGISTERED] = names
    return names


def edit_distance(a, b):
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def looks_like_autograd_op(mark):
    name = mark.name.lower()
    if edit_distance(name, MARKER) <= 2:
        return True
    return name.startswith("autograd") and "op" in mark.kwargs


def looks_like_autograd_model(mark):
    return edit_distance(mark.name.lower(), MODEL_MARKER) <= 2


def misuse_problem(item):
    """The message for a marker misuse on ``item``, or None."""
    if item.get_closest_marker(MARKER) is not None:
        if _is_unittest_method(item):
            return (f"{item.nodeid}: @pytest.mark.{MARKER} does not work on a unittest.TestCase method: pytest runs "
                    "it through unittest, which neither makes one item per check nor uses the samples the test "
                    "returns, so the op would never be checked. Move the test to a plain function or a plain class "
                    f"(class TestOps: without unittest.TestCase) whose body returns the samples, or call "
                    "pytest_autograd.run_checks(op, *args) inside the method and assert on its outcomes.")
        return None
    if item.get_closest_marker(MODEL_MARKER) is not None:
        if _is_unittest_method(item):
            return (f"{item.nodeid}: @pytest.mark.{MODEL_MARKER} does not work on a unittest.TestCase method: pytest "
                    "runs it through unittest, which neither makes one item per check nor uses the model the test "
                    "returns, so no op would be checked. Move the test to a plain function whose body returns "
                    "`model, (x,)`, or call pytest_autograd.autograd_scan(model, x) inside the method and assert "
                    "that its `wrong` list is empty.")
        return None
    registered = registered_markers(item.config)
    for mark in item.iter_markers():
        if mark.name in (MARKER, MODEL_MARKER) or mark.name in registered:
            continue
        meant = MARKER if looks_like_autograd_op(mark) else MODEL_MARKER if looks_like_autograd_model(mark) else None
        if meant is None:
            continue
        what, form = ("the op is", "(op=...)") if meant == MARKER else ("the model's ops are", "")
        return (f"{item.nodeid}: @pytest.mark.{mark.name} is not a registered marker and looks like a typo of "
                f"@pytest.mark.{meant}: as written, {what} never checked. Write "
                f"@pytest.mark.{meant}{form}, or, if {mark.name} is a marker of your own, register it under "
                "`markers` in your pytest configuration.")
    return None


def _is_unittest_method(item):
    try:
        from _pytest.unittest import TestCaseFunction
    except ImportError:  # pragma: no cover - every supported pytest has it
        return False
    return isinstance(item, TestCaseFunction)
