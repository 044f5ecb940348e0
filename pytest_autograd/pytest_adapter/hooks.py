"""The pytest hooks: options, the autograd_op marker, item generation, the header, running an item.

Imports no torch at module level: a project that installs the plugin but
has no autograd tests never pays for importing torch.
"""

import zlib

import pytest

from pytest_autograd.engine import device_faults, freed_memory, triton_interpreter
from pytest_autograd.engine.case import CORE_OPTIONS, op_display_name
from pytest_autograd.engine.check_scope import refuse_checks_out_of_scope
from pytest_autograd.engine.devices import devices_option
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.registry import CheckRegistry
from pytest_autograd.pytest_adapter import builtin_checks, hookspecs, shrinking, timeout, xfail
from pytest_autograd.pytest_adapter.fixtures import (  # noqa: F401 (fixtures)
    autograd_check,
    autograd_device,
    autograd_scan,
)
from pytest_autograd.pytest_adapter.keys import (
    ITEM_ARG,
    MARKER,
    MODEL_MARKER,
    REGISTRY,
    SETTINGS,
    TALLY,
    ItemSpec,
    MisusedMarker,
    ModelItemSpec,
    item_spec,
    misused_marker,
)
from pytest_autograd.pytest_adapter.marker import (
    positional_op_message,
    positional_ops_in_source,
    swallowed_test,
    validate_marker,
)
from pytest_autograd.pytest_adapter.marker_misuse import misuse_problem
from pytest_autograd.pytest_adapter.model_marker import validate_model_marker
from pytest_autograd.pytest_adapter.record import test_name
from pytest_autograd.pytest_adapter.shared_cases import ends_its_test, group_items_by_test, record_items
from pytest_autograd.pytest_adapter.settings import (
    WORKER_INPUT_KEY,
    Settings,
    add_options,
)
from pytest_autograd.pytest_adapter.summary import Tally

pytest_plugins = ["pytest_autograd.pytest_adapter.bench", "pytest_autograd.pytest_adapter.reporting"]


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    add_options(parser)
    timeout.add_option(parser)
    shrinking.add_options(parser)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{MARKER}(op=..., reference=None, checks=None, skip=None, devices=None, double_backward=True, "
        "atol=None, rtol=None, constants=None, xfail=None): run pytest-autograd's checks on op; the test body returns the samples.",
    )
    config.addinivalue_line(
        "markers",
        f"{MODEL_MARKER}(ops=None, skip_ops=None, checks=None, skip=None, devices=None, xfail=None, max_signatures=4, "
        "op_options=None, ...): run the model the test body returns (`return model, (x,)`) and pytest-autograd's "
        "checks on every custom autograd Function and custom op it calls.",
    )
    settings = Settings.from_config(config)
    settings.validate_devices_exist()
    device_faults.forget_all()  # a session starts with no faulted device (pytester runs several in one process)
    timeout.configure(config)
    shrinking.configure(config)
    registry = CheckRegistry()
    config.stash[SETTINGS] = settings
    config.stash[REGISTRY] = registry
    if not config.pluginmanager.is_registered(builtin_checks):
        config.pluginmanager.register(builtin_checks, "autograd-builtin-checks")
    config.hook.pytest_autograd_register_checks.call_historic(kwargs={"registry": registry})
    config.stash[TALLY] = Tally(order=registry.names())
    config.pluginmanager.register(config.stash[TALLY], "autograd-tally")
    if _is_xdist_controller(config):  # it collects nothing: validate with the checks known at start-up
        settings.validate_checks(registry.names(), before_collection=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The items of each test next to each other (after any other plugin's order): they share one case."""
    group_items_by_test(items)


def pytest_collection_finish(session):
    """``--autograd-checks`` is validated once every collected directory's conftest.py has registered its checks."""
    config = session.config
    record_items(session)
    _start_the_sandbox(config)
    if hasattr(config, "workerinput"):  # an xdist worker: its controller validated before collection
        return
    config.stash[SETTINGS].validate_checks(config.stash[REGISTRY].names())


def _start_the_sandbox(config):
    """Start the sandbox process (``engine.exploration``) in the background once the session has autograd items:
    torch's import there overlaps the end of collection and the first items, instead of holding up the first check
    that needs it."""
    from pytest_autograd.pytest_adapter.shared_cases import ITEMS_OF_TEST

    if not config.stash.get(ITEMS_OF_TEST, None) or config.stash[SETTINGS].isolate == "off" or \
            _is_xdist_controller(config):
        return
    from pytest_autograd.engine.processes import sandbox

    sandbox().start_soon()


def _is_xdist_controller(config):
    return getattr(config.option, "dist", "no") not in ("no", None) and not hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker uses the controller's base seed (the one in the header), even for 'random'."""
    node.workerinput[WORKER_INPUT_KEY] = node.config.stash[SETTINGS].seed


HEADER_SHOWN = pytest.StashKey()


def header_lines(config):
    settings = config.stash[SETTINGS]
    checks = ",".join(settings.checks) if settings.checks else "all"
    lines = [f"autograd: devices={','.join(settings.devices)} checks={checks} seed={settings.seed}"]
    interpreter = triton_interpreter.header_line()
    return lines + ([interpreter] if interpreter else [])


def pytest_report_header(config):
    """The plugin's header lines, in a project that configured the plugin; elsewhere they wait until the
    session turns out to have marked tests (:func:`show_deferred_header`), so other projects never see them."""
    if not options_given(config):
        return None
    config.stash[HEADER_SHOWN] = True
    return header_lines(config)


def options_given(config):
    """Whether a ``--autograd-*`` option or an ``autograd_*`` ini value was given for this session."""
    if any(value not in (None, False) for name, value in vars(config.option).items() if name.startswith("autograd")):
        return True
    ini = getattr(config, "_inicfg", None)  # pytest 9 deprecates the public name
    if ini is None and pytest.version_tuple < (9,):
        ini = getattr(config, "inicfg", None)
    return any(str(name).startswith("autograd_") for name in (ini or {}))


def pytest_report_collectionfinish(config, items):
    """The header lines after "collected N items", when the session has marked tests and nothing showed them."""
    if config.stash.get(HEADER_SHOWN, False) or config.getoption("verbose", 0) < 0:
        return None
    if not any(item_spec(item) is not None for item in items):
        return None
    config.stash[HEADER_SHOWN] = True
    return header_lines(config)


def show_deferred_header(config, has_marked_items):
    """Under xdist the controller collects nothing: write the header lines once a worker reports marked tests."""
    if config.stash.get(HEADER_SHOWN, False) or not has_marked_items:
        return
    config.stash[HEADER_SHOWN] = True
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.getoption("verbose", 0) < 0 or getattr(config.option, "no_header", False):
        return
    for line in header_lines(config):
        reporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The xdist controller collects nothing itself: the first worker's item ids tell it about marked tests."""
    config = node.config
    checks = config.stash[REGISTRY].names()
    marked = any(item_id.endswith("]") and any(f"{check}-" in item_id.rsplit("[", 1)[-1] for check in checks)
                 for item_id in ids)
    show_deferred_header(config, marked)


def pytest_generate_tests(metafunc):
    marks = list(metafunc.definition.iter_markers(MARKER))
    model_marks = list(metafunc.definition.iter_markers(MODEL_MARKER))
    if not marks and not model_marks:
        return
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


def pytest_pycollect_makeitem(collector, name, obj):
    """Refuse a test that ``@autograd_op(Op)`` (positional) replaced by ``Op(test)``."""
    if collector.funcnamefilter(name) and swallowed_test(obj):
        where = f"{collector.nodeid}::{name}"
        raise collector.CollectError(positional_op_message(where, op_display_name(type(obj)), name))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module that failed to import because of ``@autograd_op(op_function)`` gets told why."""
    report = yield
    if report.failed and isinstance(collector, pytest.Module) and "op positionally" not in str(report.longrepr):
        found = positional_ops_in_source(collector.path)
        if found:
            messages = [positional_op_message(f"{collector.nodeid}:{line}", op) for line, op in found]
            report.longrepr = "\n".join(messages) + f"\n\n{report.longrepr}"
    return report


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


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    misuse = misused_marker(pyfuncitem)
    if misuse is not None:  # the test body is never run: it would pass, returning its samples
        pytest.fail(misuse.problem, pytrace=False)
    spec = item_spec(pyfuncitem)
    if spec is None:
        return None
    config = pyfuncitem.config
    if isinstance(spec, ModelItemSpec):
        from pytest_autograd.pytest_adapter.model_items import run_model_item

        run_model_item(pyfuncitem, spec, config.stash[SETTINGS], config.stash[REGISTRY])
        return True
    from pytest_autograd.pytest_adapter.items import run_item

    run_item(pyfuncitem, spec, config.stash[SETTINGS], config.stash[REGISTRY])
    return True


def pytest_itemcollected(item):
    """Label each generated item with its check, device and op from the start, so that every report of it
    counts, a skip at setup included, and the xdist controller can name the op if a worker dies in the call."""
    spec = item_spec(item)
    if spec is None:
        return
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


def pytest_runtest_setup(item):
    problem = misuse_problem(item)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The memory the checks of one test kept for one another goes back to the system after its last item."""
    if ends_its_test(item, nextitem):
        freed_memory.give_back()
