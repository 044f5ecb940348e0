"""pytest-autograd: one marker turns a custom autograd op into a battery of checks.

Importing this package must stay cheap: pytest imports it in every project of
an environment that installs the plugin, and those without autograd tests must
pay for nothing else. Every name is therefore resolved on first access.
"""

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
    "Sample": "pytest_autograd.engine.case",
    "UsageProblem": "pytest_autograd.engine.outcomes",
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
