"""pytest side of the reports people read: ``--autograd-json`` and ``--autograd-plots``.

Imports no torch at module level. The process that runs an item (an xdist
worker or the only process) adds what it knows to the item's report; only
the controller writes the JSON file. Pictures are written where the item
runs, so the failure text can give their path.
"""

import importlib.util
from pathlib import Path

import pytest

from pytest_autograd.pytest_adapter.settings import option_value

RECORDER = pytest.StashKey()
PLOTS_DIR = pytest.StashKey()
SEED = pytest.StashKey()  # set by the runner for each item it runs, read when the item's record is made
RERUN = pytest.StashKey()

OPTIONS = {
    "json": ("write one JSON record per autograd item (outcome, seed, rerun command, structured failure) to "
             "this path"),
    "plots": ("write a PNG of expected, got and their difference for every failing derivative, reference, parity "
              "or precision item into this directory (needs matplotlib: pip install 'pytest-autograd[plot]')"),
}


def pytest_addoption(parser):
    group = parser.getgroup("autograd")
    for name, help_text in OPTIONS.items():
        group.addoption(f"--autograd-{name}", dest=f"autograd_{name}", default=None, metavar="PATH",
                        help=f"{help_text}. ini: autograd_{name}")
        parser.addini(f"autograd_{name}", help_text, default="")


def _value(config, name):
    return option_value(config, name) or None


def matplotlib_installed():
    return importlib.util.find_spec("matplotlib") is not None


def pytest_configure(config):
    plots = _value(config, "plots")
    if plots:
        if not matplotlib_installed():
            raise pytest.UsageError(
                "--autograd-plots needs matplotlib, which is not installed: pip install 'pytest-autograd[plot]' "
                "(or pip install matplotlib), or drop the option.")
        config.stash[PLOTS_DIR] = Path(config.invocation_params.dir, plots)
    path = _value(config, "json")
    if path and not hasattr(config, "workerinput"):  # xdist workers send their reports to the controller
        from pytest_autograd.pytest_adapter.record import Recorder

        recorder = Recorder(str(Path(config.invocation_params.dir, path)))
        config.stash[RECORDER] = recorder
        config.pluginmanager.register(recorder, "autograd-json-recorder")


def remember_for_record(item, seed, rerun):
    from pytest_autograd.engine import notes  # the runner of a marked item calls this

    notes.take()  # notes of an earlier item that ended without a record are not this item's
    item.stash[SEED] = seed
    item.stash[RERUN] = rerun


def attach_picture(report, config, nodeid):
    """With ``--autograd-plots``, draw the failure's evidence and name the PNG in the report."""
    directory = None if config is None else config.stash.get(PLOTS_DIR, None)
    if directory is None or not report.evidence:
        return
    from pytest_autograd.results.plots import save_picture

    try:
        path = save_picture(report, directory, nodeid or report.check)
    except Exception as error:  # a picture must never hide the failure it illustrates
        report.details.append(f"picture: not drawn ({type(error).__name__}: {error})")
        return
    if path is not None:
        report.picture = str(path)
        report.details.append(f"picture: {path}")


def wants_record(config):
    return bool(_value(config, "json"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when != "call" or not wants_record(item.config):
        return report
    from pytest_autograd.engine import notes
    from pytest_autograd.pytest_adapter.keys import item_spec
    from pytest_autograd.pytest_adapter.record import PROPERTY, test_name, worker_fields

    spec = item_spec(item)
    if spec is None:
        return report
    failure = getattr(call.excinfo.value, "autograd_report", None) if call.excinfo is not None else None
    fields = worker_fields(
        test=test_name(item.nodeid, str(spec)),
        seed=item.stash.get(SEED, None),
        rerun=item.stash.get(RERUN, None),
        report=failure,
        notes=notes.take(),
    )
    report.user_properties = [*report.user_properties, (PROPERTY, fields)]
    return report




def pytest_sessionfinish(session):
    recorder = session.config.stash.get(RECORDER, None)
    if recorder is not None:
        recorder.write()


def pytest_terminal_summary(terminalreporter, config):
    recorder = config.stash.get(RECORDER, None)
    if recorder is not None and recorder.records:
        terminalreporter.write_line(f"autograd: {len(recorder.records)} records written to {recorder.path}")
