"""The one registry of checks, filled through the plugin's own hook.

Entries can be lazy (a module path) so that validating ``--autograd-checks``
and generating items never imports torch before a marked test needs it.
"""

import importlib


class CheckRegistry:
    """Ordered name -> check mapping; lazy entries are imported on first use."""

    def __init__(self):
        self._entries = {}

    def add(self, check):
        """Register a ready :class:`pytest_autograd.Check` instance."""
        name = getattr(check, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a check needs a non-empty string `name`, got {check!r}")
        self._entries[name] = check

    def add_lazy(self, name, module_path):
        """Register ``module_path`` whose module defines ``check = SomeCheck()``."""
        self._entries[name] = module_path

    def names(self):
        return list(self._entries)

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
