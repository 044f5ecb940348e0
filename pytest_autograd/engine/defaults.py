"""The engine's default time budgets, in a module of their own: the pytest options that override them declare
them at start-up, and importing this imports nothing else."""

DEFAULT_SECONDS = 300.0  # each check's time budget unless the caller sets one (see engine/budget.py)
DEFAULT_SHRINK_SECONDS = 10.0  # the time a failing sample may be shrunk for (see engine/shrink.py)
