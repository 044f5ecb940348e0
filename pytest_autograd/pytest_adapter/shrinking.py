"""``--autograd-shrink`` and ``--autograd-repro`` with their ini twins: what follows a failure (engine/after_failure)."""

from pathlib import Path

import pytest

from pytest_autograd.engine.defaults import DEFAULT_SHRINK_SECONDS
from pytest_autograd.pytest_adapter import settings
from pytest_autograd.pytest_adapter.timeout import parse_seconds

SHRINK = "autograd_shrink"
REPRO = "autograd_repro"
SHRINK_SECONDS = pytest.StashKey()
REPRO_DIR = pytest.StashKey()
SHRINK_HELP = (f"seconds a failing item may spend shrinking its sample to the smallest one that fails the same way "
               f"(default {DEFAULT_SHRINK_SECONDS:g}; 0: off)")
REPRO_HELP = ("write, for every failing item, a stand-alone Python script (only torch and the op) and its sample "
              "tensors into this directory")


def add_options(parser):
    group = parser.getgroup("autograd", "autograd op checks (pytest-autograd)")
    group.addoption("--autograd-shrink", dest=SHRINK, default=None, metavar="SECONDS", help=f"{SHRINK_HELP}. ini: {SHRINK}")
    settings.add_number_ini(parser, SHRINK, SHRINK_HELP, DEFAULT_SHRINK_SECONDS, float)
    group.addoption("--autograd-repro", dest=REPRO, default=None, metavar="DIR", help=f"{REPRO_HELP}. ini: {REPRO}")
    parser.addini(REPRO, REPRO_HELP, default="")


def configure(config):
    """Validate both once per session; keep the values in the config's stash."""
    value, source = config.getoption(SHRINK, None), "--autograd-shrink"
    if value is None:
        value, source = settings._getini(config, SHRINK), f"ini {SHRINK}"
    config.stash[SHRINK_SECONDS] = parse_seconds(value, source, fix="e.g. --autograd-shrink=10 (or autograd_shrink "
                                                 "= 10 in the ini file), or 0 to report failing samples unshrunk")
    directory = config.getoption(REPRO, None) or str(config.getini(REPRO) or "").strip()
    config.stash[REPRO_DIR] = str(Path(config.invocation_params.dir, directory)) if directory else None


def shrink_seconds(config):
    return config.stash.get(SHRINK_SECONDS, DEFAULT_SHRINK_SECONDS)


def repro_dir(config):
    return config.stash.get(REPRO_DIR, None)
