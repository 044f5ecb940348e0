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


def refuse_checks_out_of_scope(registry, mark, known_checks, where):
    """A check named on the marker but registered by a conftest.py of another directory: say so."""
    from pytest_autograd.engine.outcomes import UsageProblem

    for option in ("checks", "skip", "xfail"):
        names = mark.kwargs.get(option)
        names = [names] if isinstance(names, str) else list(names or [])
        for name in names:
            if isinstance(name, str) and name in registry and name not in known_checks:
                raise UsageProblem(
                    f"{where}: {option}= names check {name!r}, which {registry.scope(name) / 'conftest.py'} registers "
                    "for the tests in its directory only; register it in a conftest.py above this test (e.g. the "
                    "rootdir's) or in a plugin to use it here."
                )
