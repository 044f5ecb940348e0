"""The built-in checks: their names and order, and registering them in a registry.

Every module in ``pytest_autograd/checks/`` whose name does not start with
``_`` (and is not ``base``) is one check named after the module. Known checks
come first in a fixed order so items read naturally; others follow by name.
"""

import pkgutil

import pytest_autograd.checks as _checks_package

ORDER = [
    "gradcheck",
    "gradgradcheck",
    "parity",
    "reference",
    "sizes",
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
    "checkpoint",
    "offload",
    "accumulation",
    "overflow",
    "rng",
    "forward_ad",
    "vmap",
    "opcheck",
    "compile",
    "precision",
    "autocast",
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


def register_builtin_checks(registry):
    """Add every built-in check to ``registry``, lazily (a check's module is imported on first use)."""
    for name in builtin_check_names():
        registry.add_lazy(name, f"pytest_autograd.checks.{name}")
