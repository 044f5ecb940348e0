"""The one registry of checks, filled through the plugin's own hook.

Entries can be lazy (a module path) so that validating ``--autograd-checks``
and generating items never imports torch before a marked test needs it.
"""

import importlib

from pytest_autograd.engine.check_scope import applies_under, registering_conftest_dir


class CheckRegistry:
    """Ordered name -> check mapping; lazy entries are imported on first use."""

    def __init__(self):
        self._entries = {}
        self._scopes = {}  # name -> directory of the registering conftest.py (None: everywhere)

    def add(self, check):
        """Register a ready :class:`pytest_autograd.Check` instance."""
        name = getattr(check, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a check needs a non-empty string `name`, got {check!r}")
        self._entries[name] = check
        self._scopes[name] = registering_conftest_dir()

    def add_lazy(self, name, module_path):
        """Register ``module_path`` whose module defines ``check = SomeCheck()``."""
        self._entries[name] = module_path
        self._scopes[name] = registering_conftest_dir()

    def names(self):
        return list(self._entries)

    def scope(self, name):
        """Directory of the conftest.py that registered ``name``; None when it applies everywhere."""
        return self._scopes.get(name)

    def names_for(self, path):
        """The checks that apply to the test file at ``path`` (see :mod:`pytest_autograd.engine.check_scope`)."""
        return [name for name in self._entries if applies_under(self._scopes.get(name), path)]

    def visible_from(self, path):
        """A registry holding only the checks that apply to the test file at ``path``."""
        view = CheckRegistry()
        for name in self.names_for(path):
            view._entries[name] = self._entries[name]
            view._scopes[name] = self._scopes.get(name)
        return view

    def __contains__(self, name):
        return name in self._entries

    def get(self, name):
        entry = self._entries[name]
        if isinstance(entry, str):
            module = importlib.import_module(entry)
            entry = module.check
            if entry.name != name:
                raise RuntimeError(f"{module.__name__}.check is named {entry.name!r}, registered as {name!r}")
            self._entries[name] = entry
        return entry

    def checks(self):
        return [self.get(name) for name in self._entries]
