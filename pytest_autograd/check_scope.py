"""Where a registered check applies: everywhere, or under the conftest.py that registered it.

pytest loads a sub-directory's ``conftest.py`` only when it collects that
directory, so a check it registers would otherwise exist for the tests
collected after it and not for those before. Scoping it like a fixture
defined in that ``conftest.py`` (the tests in its directory and below) makes
the set of checks of a test independent of collection order. Checks
registered by plugins (installed, ``-p``, ``pytest_plugins``) apply everywhere.
"""

import os
import sys
from pathlib import Path

HOOK_NAME = "pytest_autograd_register_checks"


def registering_conftest_dir():
    """The directory of the conftest.py whose hook is registering a check now; None for a plugin."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == HOOK_NAME:
            file = frame.f_globals.get("__file__")
            if file and os.path.basename(file) == "conftest.py":
                return Path(file).resolve().parent
            return None
        frame = frame.f_back
    return None


def applies_under(scope, path):
    """True when a check of ``scope`` (None: everywhere) applies to the test file at ``path``."""
    if scope is None or path is None:
        return True
    path = Path(str(path)).resolve()
    return path == scope or scope in path.parents


def describe(scope):
    return "a plugin" if scope is None else f"{scope / 'conftest.py'}"
