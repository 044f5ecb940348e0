"""Registers the built-in checks through the plugin's own hook.

Every module in ``pytest_autograd/checks/`` whose name does not start with
``_`` (and is not ``base``) is one check named after the module. Known checks
come first in a fixed order so items read naturally; others follow by name.
"""

import pkgutil

import pytest

import pytest_autograd.checks as _checks_package

ORDER = [
    "gradcheck",
    "gradgradcheck",
    "parity",
    "reference",
    "mutation",
    "requires_grad",
    "undefined_grad",
    "noncontiguous",
    "determinism",
    "grad_metadata",
    "leak",
    "growth",
    "aliasing",
    "reentrancy",
    "rng",
    "forward_ad",
    "vmap",
    "opcheck",
    "compile",
    "precision",
    "extreme",
    "bench",
]


def builtin_check_names():
    found = {
        info.name
        for info in pkgutil.iter_modules(_checks_package.__path__)
        if not info.name.startswith("_") and info.name != "base"
    }
    known = [name for name in ORDER if name in found]
    return known + sorted(found - set(known))


@pytest.hookimpl
def pytest_autograd_register_checks(registry):
    for name in builtin_check_names():
        registry.add_lazy(name, f"pytest_autograd.checks.{name}")
