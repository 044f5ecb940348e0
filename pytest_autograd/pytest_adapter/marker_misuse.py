"""Markers that would leave an op unchecked, reported on the test that carries them.

A plugin loaded in every project of an environment must never stop a
session over a marker: the project's own markers (``autograd``,
``autograd_slow``, ... registered in ``markers`` or with
``config.addinivalue_line``) are never an error. Only an unregistered name
within two typos of ``autograd_op`` (or ``autograd...`` given ``op=``) or of
``autograd_model`` is reported, as a failure of the tests that carry it when
they run, so deselected tests (``-k``, ``-m``) never see it.

``autograd_op`` attached where the plugin cannot expand it into items is
refused the same way, naming the supported form: on a ``unittest.TestCase``
method (pytest never parametrizes it), through ``pytest.param(...,
marks=...)`` or ``item.add_marker`` (applied after the items were made),
on a fixture (pytest < 9 ignores marks there), and on a hypothesis
``@given`` test (hypothesis calls the body many times and discards what it
returns). Each of these would otherwise pass with the op unchecked.
"""

import re

import pytest

from pytest_autograd.pytest_adapter.keys import ITEM_ARG, MARKER

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


RUN_CHECKS = "call pytest_autograd.run_checks(op, *args) inside the test and assert that no outcome failed"


def misuse_problem(item):
    """The message for a marker misuse on ``item``, or None."""
    if item.get_closest_marker(MARKER) is not None:
        return _unexpanded_marker_problem(item)
    if item.get_closest_marker(MODEL_MARKER) is not None:
        if _is_unittest_method(item):
            return (f"{item.nodeid}: @pytest.mark.{MODEL_MARKER} does not work on a unittest.TestCase method: pytest "
                    "runs it through unittest, which neither makes one item per check nor uses the model the test "
                    "returns, so no op would be checked. Move the test to a plain function whose body returns "
                    "`model, (x,)`, or call pytest_autograd.autograd_scan(model, x) inside the method and assert "
                    "that its `wrong` list is empty.")
        return None
    fixture = _marked_fixture(item)
    if fixture is not None:
        return (f"{item.nodeid}: @pytest.mark.{MARKER} is on the fixture {fixture!r}, where pytest ignores marks, so "
                "the op would never be checked. Put the marker on the test function, whose body returns the "
                f"samples (it may take the fixture as an argument), or {RUN_CHECKS}.")
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


def _unexpanded_marker_problem(item):
    """Why the autograd_op marker on ``item`` would check nothing, or None when the plugin expanded it."""
    if _is_unittest_method(item):
        return (f"{item.nodeid}: @pytest.mark.{MARKER} does not work on a unittest.TestCase method: pytest runs "
                "it through unittest, which neither makes one item per check nor uses the samples the test "
                "returns, so the op would never be checked. Move the test to a plain function or a plain class "
                f"(class TestOps: without unittest.TestCase) whose body returns the samples, or {RUN_CHECKS}.")
    if ITEM_ARG not in getattr(getattr(item, "callspec", None), "params", {}):
        return (f"{item.nodeid}: @pytest.mark.{MARKER} reached this test after its items were made (through "
                "pytest.param(..., marks=...) or item.add_marker), so no check would run and the test would pass. "
                f"Put the marker on the test function itself; to check several ops, stack one @pytest.mark.{MARKER}"
                "(op=...) per op on the test (its items are named after each op), or write one test per op.")
    if getattr(item.obj, "is_hypothesis_test", False):
        return (f"{item.nodeid}: @pytest.mark.{MARKER} cannot use a hypothesis @given test: hypothesis calls the "
                "body many times and discards what it returns, so the plugin gets no samples. Drop @given and "
                "return the samples (vary sizes with @pytest.mark.parametrize), or keep @given and "
                f"{RUN_CHECKS}.")
    return None


def _marked_fixture(item):
    """The name of a fixture ``item`` uses that carries an autograd_op mark (pytest < 9 ignores it silently)."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
    for name, fixturedefs in definitions.items():
        for fixturedef in fixturedefs or ():
            function = getattr(fixturedef, "func", None)
            for candidate in (function, getattr(function, "__wrapped__", None)):
                marks = getattr(candidate, "pytestmark", None) or []
                if any(getattr(mark, "name", None) == MARKER for mark in marks):
                    return name
    return None


def _is_unittest_method(item):
    try:
        from _pytest.unittest import TestCaseFunction
    except ImportError:  # pragma: no cover - every supported pytest has it
        return False
    return isinstance(item, TestCaseFunction)
