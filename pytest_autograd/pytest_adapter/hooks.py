"""The pytest hooks: options, the autograd_op marker, item generation, the header, running an item.

A project that installs the plugin but has no autograd tests pays for
declaring the options and little else: this module imports only what every
session needs, and each hook imports the module that does its work once
there is work (a marked test, a generated item, a check that ran in this
process). Such a session never imports torch, nor the engine's cases and
checks (``tests/test_plugin_startup.py`` lists what it may import).
"""

from contextlib import contextmanager
import sys

import pytest

from pytest_autograd.engine.registry import CheckRegistry
from pytest_autograd.pytest_adapter import builtin_checks, hookspecs, shrinking, timeout
from pytest_autograd.pytest_adapter.fixtures import (  # noqa: F401 (fixtures)
    autograd_check,
    autograd_device,
    autograd_scan,
)
from pytest_autograd.pytest_adapter.keys import (
    MARKER,
    MODEL_MARKER,
    REGISTRY,
    SETTINGS,
    TALLY,
    TALLY_ORDER,
    item_spec,
    misused_marker,
)
from pytest_autograd.pytest_adapter.positional_op import (
    positional_op_message,
    positional_ops_in_source,
    swallowed_test,
)
from pytest_autograd.pytest_adapter.settings import (
    WORKER_INPUT_KEY,
    Settings,
    add_options,
)

ENTRY_POINT = "pytest_autograd.plugin"


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspecs)


def pytest_plugin_registered(plugin, manager):
    """Right after the entry point, the bench and report modules are registered as plugins of their own, as
    ``pytest_plugins`` would, in its order. Listed there, each would cost a scan of every installed distribution's
    entry points and a pass through pytest's assertion rewriter on every run."""
    if getattr(plugin, "__name__", None) != ENTRY_POINT:
        return
    from pytest_autograd.pytest_adapter import bench, reporting

    for module in (bench, reporting):
        if manager.get_plugin(module.__name__) is None:
            manager.register(module, module.__name__)


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
    faults = _loaded("device_faults")
    if faults is not None:  # a session starts with no faulted device (pytester runs several in one process)
        faults.forget_all()
    timeout.configure(config)
    shrinking.configure(config)
    registry = CheckRegistry()
    config.stash[SETTINGS] = settings
    config.stash[REGISTRY] = registry
    if not config.pluginmanager.is_registered(builtin_checks):
        config.pluginmanager.register(builtin_checks, "autograd-builtin-checks")
    config.hook.pytest_autograd_register_checks.call_historic(kwargs={"registry": registry})
    config.stash[TALLY_ORDER] = registry.names()  # the summary's rows, whenever its Tally is made (_tally)
    if _is_xdist_controller(config):  # it collects nothing: validate with the checks known at start-up
        settings.validate_checks(registry.names(), before_collection=True)


def _loaded(name):
    """The engine module ``name`` if this process imported it (it ran a check), else None: a process that never
    ran one has nothing for it to undo, and need not import it to find out."""
    return sys.modules.get(f"pytest_autograd.engine.{name}")


def _tally(config):
    """The Tally counting the session's generated items, made and registered when the first is collected (on the
    xdist controller, when a worker collected one): a session without any never imports the summary."""
    if TALLY not in config.stash:
        from pytest_autograd.pytest_adapter.summary import Tally

        config.stash[TALLY] = Tally(order=config.stash[TALLY_ORDER])
        config.pluginmanager.register(config.stash[TALLY], "autograd-tally")
    return config.stash[TALLY]


def _has_generated_items(items):
    return any(item_spec(item) is not None for item in items)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The items of each test next to each other (after any other plugin's order): they share one case."""
    if _has_generated_items(items):
        from pytest_autograd.pytest_adapter.shared_cases import group_items_by_test

        group_items_by_test(items)


def pytest_collection_finish(session):
    """``--autograd-checks`` is validated once every collected directory's conftest.py has registered its checks."""
    config = session.config
    if _has_generated_items(session.items):
        from pytest_autograd.pytest_adapter.shared_cases import record_items

        record_items(session)
        _start_the_sandbox(session)
    if hasattr(config, "workerinput"):  # an xdist worker: its controller validated before collection
        return
    config.stash[SETTINGS].validate_checks(config.stash[REGISTRY].names())


def _start_the_sandbox(session):
    """Start the sandbox process (``engine.exploration``) in the background once the session has autograd items,
    and have it import the test modules: torch's import there, and the ops', overlap the end of collection and the
    first items, instead of holding up the first check that needs them."""
    from pytest_autograd.pytest_adapter.shared_cases import ITEMS_OF_TEST

    config = session.config
    if not config.stash.get(ITEMS_OF_TEST, None) or config.stash[SETTINGS].isolate == "off" or \
            _is_xdist_controller(config):
        return
    from pytest_autograd.engine.exploration.whole_checks import warm
    from pytest_autograd.engine.processes import sandbox

    modules = list(dict.fromkeys(item.module.__name__ for item in session.items
                                 if item_spec(item) is not None and getattr(item, "module", None) is not None))
    _farewell_to_the_real_stderr(config, sandbox())
    sandbox().start_soon(warm, modules)


def _farewell_to_the_real_stderr(config, worker):
    """The sandbox's farewell (the session's process died in an op) goes to the terminal or log the session writes
    to, never into the capture of the item under way."""
    from contextlib import nullcontext

    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        worker.farewell_to(2)


def _is_xdist_controller(config):
    return getattr(config.option, "dist", "no") not in ("no", None) and not hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker uses the controller's base seed (the one in the header), even for 'random'."""
    node.workerinput[WORKER_INPUT_KEY] = node.config.stash[SETTINGS].seed


def pytest_report_header(config):
    """The plugin's header lines, in a project that configured the plugin (:mod:`header`)."""
    from pytest_autograd.pytest_adapter import header

    return header.start_up_lines(config)


def pytest_report_collectionfinish(config, items):
    """The header lines after "collected N items", when the session has marked tests and nothing showed them."""
    if not _has_generated_items(items):
        return None
    from pytest_autograd.pytest_adapter import header

    return header.after_collection_lines(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The xdist controller collects nothing itself: the first worker's item ids tell it about marked tests."""
    from pytest_autograd.pytest_adapter import header

    marked = header.has_marked_item_ids(node.config, ids)
    if marked:
        _tally(node.config)
    header.show_deferred_header(node.config, marked)


def pytest_generate_tests(metafunc):
    marks = list(metafunc.definition.iter_markers(MARKER))
    model_marks = list(metafunc.definition.iter_markers(MODEL_MARKER))
    if not marks and not model_marks:
        return
    from pytest_autograd.pytest_adapter.item_generation import generate_items

    generate_items(metafunc, marks, model_marks)


def pytest_pycollect_makeitem(collector, name, obj):
    """Refuse a test that ``@autograd_op(Op)`` (positional) replaced by ``Op(test)``."""
    if collector.funcnamefilter(name) and swallowed_test(obj):
        from pytest_autograd.engine.case import op_display_name

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


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    misuse = misused_marker(pyfuncitem)
    if misuse is not None:  # the test body is never run: it would pass, returning its samples
        pytest.fail(misuse.problem, pytrace=False)
    spec = item_spec(pyfuncitem)
    if spec is None:
        return None
    from pytest_autograd.pytest_adapter.item_specs import ModelItemSpec

    config = pyfuncitem.config
    with _told_if_it_crashes(pyfuncitem, config.stash[SETTINGS]):
        if isinstance(spec, ModelItemSpec):
            from pytest_autograd.pytest_adapter.model_items import run_model_item

            run_model_item(pyfuncitem, spec, config.stash[SETTINGS], config.stash[REGISTRY])
            return True
        from pytest_autograd.pytest_adapter.items import run_item

        run_item(pyfuncitem, spec, config.stash[SETTINGS], config.stash[REGISTRY])
        return True


@contextmanager
def _told_if_it_crashes(item, settings):
    """While the item runs, the sandbox knows it: if this process dies meanwhile (an op's crash), the sandbox it
    leaves names the item. Outside items it knows nothing, and says nothing when the process ends."""
    if settings.isolate == "off":
        yield
        return
    from pytest_autograd.engine.processes import sandbox

    sandbox().mark(item.nodeid)
    try:
        yield
    finally:
        sandbox().mark("")


def pytest_itemcollected(item):
    """Label each generated item with its check, device and op from the start (see ``label_item``)."""
    spec = item_spec(item)
    if spec is None:
        return
    from pytest_autograd.pytest_adapter.item_generation import label_item

    _tally(item.config)
    label_item(item, spec)


def pytest_runtest_setup(item):
    """A marker that would leave an op unchecked (a typo, a place the plugin cannot expand it) fails its test."""
    if not _carries_a_mark(item):
        return
    from pytest_autograd.pytest_adapter.marker_misuse import misuse_problem

    problem = misuse_problem(item)
    if problem:
        pytest.fail(problem, pytrace=False)


def _carries_a_mark(item):
    """Whether ``item`` or a fixture it uses carries a mark: only then can a marker on it be misused
    (``marker_misuse`` looks no further than these)."""
    if next(iter(item.iter_markers()), None) is not None:
        return True
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None) or {}
    functions = [getattr(fixturedef, "func", None) for fixturedefs in definitions.values()
                 for fixturedef in fixturedefs or ()]
    return any(getattr(function, "pytestmark", None) or getattr(getattr(function, "__wrapped__", None), "pytestmark",
                                                                 None) for function in functions)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The memory the checks of one test kept for one another goes back to the system after its last item."""
    memory = _loaded("freed_memory")
    if memory is None:
        return
    from pytest_autograd.pytest_adapter.shared_cases import ends_its_test

    if ends_its_test(item, nextitem):
        memory.give_back()
