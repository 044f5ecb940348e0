"""One marked test, many items: the ``(check, device)`` parametrization of an ``autograd_op`` or
``autograd_model`` test, and the labels each generated item carries from collection on.

Imported by the hooks once they meet a marked test: a session without one never loads it, nor the engine
modules it validates markers with.
"""

import zlib

import pytest

from pytest_autograd.engine.case import CORE_OPTIONS, op_display_name
from pytest_autograd.engine.check_scope import refuse_checks_out_of_scope
from pytest_autograd.engine.devices import devices_option
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.pytest_adapter import xfail
from pytest_autograd.pytest_adapter.item_specs import ItemSpec, MisusedMarker, ModelItemSpec
from pytest_autograd.pytest_adapter.keys import ITEM_ARG, MARKER, REGISTRY, SETTINGS
from pytest_autograd.pytest_adapter.marker import validate_marker
from pytest_autograd.pytest_adapter.model_marker import validate_model_marker
from pytest_autograd.pytest_adapter.record import test_name


def generate_items(metafunc, marks, model_marks):
    """Parametrize a test carrying ``marks`` (``autograd_op``) or ``model_marks`` (``autograd_model``) over its
    items; a misused marker gives the test one ``usage-error`` item instead."""
    config = metafunc.config
    settings, registry = config.stash[SETTINGS], config.stash[REGISTRY]
    where = metafunc.definition.nodeid
    known_checks = registry.names_for(metafunc.definition.path)
    labels = [""] if model_marks else _marker_labels(marks)
    params = []
    for index, mark in enumerate(model_marks[:1] or marks):
        try:
            selected = _selected_checks(settings, registry, mark, known_checks)
            refuse_checks_out_of_scope(registry, mark, known_checks, where)
            if model_marks:
                validate_model_marker(model_marks, marks, _all_options(registry), known_checks, where)
            else:
                validate_marker(mark, _known_options(registry, mark, selected), known_checks, where)
            reasons = xfail.xfail_reasons(mark.kwargs.get(xfail.OPTION), known_checks, where)
            devices = _marker_devices(mark, settings, where)
        except (UsageProblem, pytest.UsageError) as problem:
            metafunc.fixturenames.append(ITEM_ARG)
            metafunc.parametrize(ITEM_ARG, [pytest.param(MisusedMarker(str(problem)), id="usage-error")])
            return
        for name, explicit in selected:
            for device in devices:
                spec = (ModelItemSpec if model_marks else ItemSpec)(name, device, explicit, index)
                item_id = f"{labels[index]}-{spec}" if labels[index] else str(spec)
                params.append(xfail.item_param(spec, item_id, reasons))
    metafunc.fixturenames.append(ITEM_ARG)
    if not params:
        reason = ("no check selected: the marker's checks=/skip= and --autograd-checks="
                  f"{','.join(settings.checks or [])} leave none to run")
        metafunc.parametrize(ITEM_ARG, [pytest.param(None, marks=pytest.mark.skip(reason=reason))], ids=["no-checks"])
        return
    metafunc.parametrize(ITEM_ARG, params)


def _marker_devices(mark, settings, where):
    return devices_option(mark.kwargs.get("devices") or settings.devices, f"{where}: devices=")


def _marker_labels(marks):
    """Item id prefixes telling several autograd_op markers of one test apart ('' for a single marker)."""
    if len(marks) == 1:
        return [""]
    names = [op_display_name(mark.kwargs.get("op")) for mark in marks]
    if len(set(names)) == len(names):
        return names
    return [f"op{index}-{name}" for index, name in enumerate(names)]


def _known_options(registry, mark, selected):
    """Marker keywords the core and the checks understand.

    Only the checks this test runs are imported to ask for their options;
    every check module is imported only when a keyword is still unknown.
    """
    known = dict(CORE_OPTIONS)
    known[xfail.OPTION] = None
    for name, _ in selected:
        known.update(getattr(registry.get(name), "options", {}) or {})
    if set(mark.kwargs) - set(known):
        for check in registry.checks():
            known.update(getattr(check, "options", {}) or {})
    return known


def _all_options(registry):
    """Every option a check understands (a model's ops may be given any of them in op_options=)."""
    known = dict(CORE_OPTIONS)
    for check in registry.checks():
        known.update(getattr(check, "options", {}) or {})
    return known


def _selected_checks(settings, registry, mark, known_checks):
    """(name, explicitly selected) for each check this marked test runs."""
    wanted = mark.kwargs.get("checks")
    wanted = [wanted] if isinstance(wanted, str) else wanted
    skipped = mark.kwargs.get("skip") or []
    skipped = [skipped] if isinstance(skipped, str) else skipped
    chosen = []
    for name in known_checks:
        if settings.checks is not None and name not in settings.checks:
            continue
        if wanted is not None and name not in wanted:
            continue
        if name in skipped:
            continue
        chosen.append((name, settings.checks is not None or wanted is not None))
    return chosen


def label_item(item, spec):
    """Label a generated item with its check, device and op from the start, so that every report of it counts,
    a skip at setup included, and the xdist controller can name the op if a worker dies in the call."""
    item.user_properties.append(("autograd", f"{spec.check}|{spec.device}"))
    marks = list(item.iter_markers(MARKER))
    if marks:  # an autograd_model item names its ops only once they ran
        mark = marks[spec.marker] if spec.marker < len(marks) else marks[0]
        item.user_properties.append(("autograd_op", op_display_name(mark.kwargs.get("op"))))
    group_with_its_test(item, spec)


def group_with_its_test(item, spec):
    """Under ``--dist loadgroup`` all items of one test run on one worker (one xdist_group per test), so the
    one-report-per-cause pointers and per-test caches hold as in a serial run. Bench items keep their own
    group per device, which runs them one at a time. Done as items are collected: pytest-xdist reads the
    groups in its own collection hook."""
    if not getattr(item.config.option, "loadgroup", False) or spec.check == "bench":
        return
    test = test_name(item.nodeid, str(spec)).encode()
    item.add_marker(pytest.mark.xdist_group(f"autograd-test-{zlib.crc32(test):08x}"))
