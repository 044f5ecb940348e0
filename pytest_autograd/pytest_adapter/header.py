"""The plugin's header lines (devices, checks, seed; Triton's interpreter): shown at start-up in a project that
configured the plugin, else once the session turns out to have marked tests, so other projects never see them."""

import pytest

from pytest_autograd.pytest_adapter.keys import REGISTRY, SETTINGS

HEADER_SHOWN = pytest.StashKey()


def header_lines(config):
    settings = config.stash[SETTINGS]
    checks = ",".join(settings.checks) if settings.checks else "all"
    lines = [f"autograd: devices={','.join(settings.devices)} checks={checks} seed={settings.seed}"]
    from pytest_autograd.engine import triton_interpreter

    interpreter = triton_interpreter.header_line()
    return lines + ([interpreter] if interpreter else [])


def start_up_lines(config):
    """The header lines at start-up, in a project that configured the plugin; else None (they may come later)."""
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


def after_collection_lines(config):
    """The header lines after "collected N items", when the session has marked tests and nothing showed them."""
    if config.stash.get(HEADER_SHOWN, False) or config.getoption("verbose", 0) < 0:
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


def has_marked_item_ids(config, ids):
    """Whether a worker's collected item ids include generated ones (``test_x[gradcheck-cpu]``)."""
    checks = config.stash[REGISTRY].names()
    return any(item_id.endswith("]") and any(f"{check}-" in item_id.rsplit("[", 1)[-1] for check in checks)
               for item_id in ids)
