"""The engine: runs checks on an op without pytest.

Cases and samples (``case``), running the op and differentiating it (``execution``), devices, budgets,
seeding, the registry of checks and the check interface (``pytest_autograd.checks.base``), and
:func:`pytest_autograd.engine.api.run_checks`, the entry point for scripts, notebooks and unittest.
Nothing here imports pytest or the adapter; checks in ``pytest_autograd.checks`` use only the engine
and the result values.
"""
