"""pytest-autograd: one marker turns a custom autograd op into a battery of checks.

Importing this package must stay cheap: projects that install the plugin but
have no autograd tests never pay for importing torch. Names that need torch
are therefore resolved lazily on first access.
"""

from pytest_autograd.engine.case import Sample
from pytest_autograd.engine.outcomes import UsageProblem

__all__ = [
    "Sample",
    "UsageProblem",
    "Outcome",
    "Check",
    "CheckContext",
    "CheckFailure",
    "Report",
    "run_checks",
    "autograd_scan",
    "ScanResult",
]

_LAZY = {
    "Check": "pytest_autograd.checks.base",
    "CheckContext": "pytest_autograd.checks.base",
    "CheckFailure": "pytest_autograd.results.report",
    "Report": "pytest_autograd.results.report",
    "Outcome": "pytest_autograd.engine.api",
    "run_checks": "pytest_autograd.engine.api",
    "autograd_scan": "pytest_autograd.engine.model_scan",
    "ScanResult": "pytest_autograd.engine.model_scan",
}


def __getattr__(name):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'pytest_autograd' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
