"""``--autograd-timeout`` and its ini twin: the time budget of each item (see the engine's ``budget``)."""

import pytest

from pytest_autograd.engine.defaults import DEFAULT_SECONDS
from pytest_autograd.pytest_adapter import settings

OPTION = "autograd_timeout"
SECONDS = pytest.StashKey()
HELP = "seconds each item may run before it is stopped and fails, naming where it was (default 300; 0: no limit)"


def add_option(parser):
    """``--autograd-timeout`` and its ini twin ``autograd_timeout``."""
    group = parser.getgroup("autograd", "autograd op checks (pytest-autograd)")
    group.addoption("--autograd-timeout", dest=OPTION, default=None, help=f"{HELP}. ini: {OPTION}")
    settings.add_number_ini(parser, OPTION, HELP, DEFAULT_SECONDS, float)


FIX = "e.g. --autograd-timeout=120 (or autograd_timeout = 120 in the ini file), or 0 to run items without a time limit"


def parse_seconds(text, source="--autograd-timeout", fix=FIX):
    """Seconds from an option's text; None when 0 (disabled). ``fix``: what to pass instead, for the error."""
    try:
        seconds = float(str(text).strip())
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise pytest.UsageError(f"{source}: {text!r} is not a number of seconds; pass {fix}")
    return seconds or None


def configure(config):
    """Validate the option once per session and keep the item budget in the config's stash."""
    value, source = config.getoption(OPTION, None), "--autograd-timeout"
    if value is None:
        value, source = config.getini(OPTION), f"ini {OPTION}"
    seconds = parse_seconds(value, source)
    if config.getoption("usepdb", False):  # a debugger session must not be interrupted
        seconds = None
    config.stash[SECONDS] = seconds


def item_seconds(config):
    """The per-item budget: the configured one, the default outside a pytest session."""
    if config is None:
        return DEFAULT_SECONDS
    return config.stash.get(SECONDS, DEFAULT_SECONDS)
