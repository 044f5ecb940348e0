"""Hooks through which checks are registered and samples adjusted.

The built-in checks register through ``pytest_autograd_register_checks``
exactly as a third-party plugin or a ``conftest.py`` would.
"""

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec(historic=True)
def pytest_autograd_register_checks(registry):
    """Add checks to ``registry`` (a :class:`pytest_autograd.engine.registry.CheckRegistry`).

    Call ``registry.add(check)`` with a :class:`pytest_autograd.Check`
    instance, or ``registry.add_lazy(name, "module.path")`` to import the
    module (which defines ``check = ...``) only when a marked test needs it.
    Historic: conftest files loaded later still get to register.
    """


@hookspec
def pytest_autograd_setup_rank(rank, world_size):
    """Build the project's own parallel state on every rank of a process group that checks an op across ranks
    (``world_size=`` on the marker), once the default process group is formed: Megatron-style
    ``initialize_model_parallel(tensor_model_parallel_size=world_size)``, say.

    Runs in each rank's process, not in pytest's: the implementation is imported there from its module (a
    conftest's from its file), and gets no pytest objects.
    """


@hookspec
def pytest_autograd_adjust_samples(case, device):
    """Return a new list of samples for ``case`` on ``device``, or None to keep them.

    Called once per item before the check runs, e.g. to shrink sizes on CPU.
    """
