"""How a check ends other than by passing or failing: the op raised, the check cannot judge the op
(skipped, with the reason), or the user made a mistake. Plain exceptions, so the engine needs no pytest;
the adapter turns them into pytest's outcomes."""

import traceback


class UsageProblem(Exception):
    """A mistake in how the plugin was used: reported without a traceback."""


class CheckSkipped(Exception):
    """The check cannot judge this op here (a dtype it has no kernel for, an option that turns it off)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def skip(reason):
    """End the running check as skipped, saying why; the item is reported at the test's location."""
    raise CheckSkipped(reason)


def pytest_skip_reason(error):
    """The reason of a ``pytest.skip()`` raised inside a check (a user's own check may call it); else None.

    Recognised by type name, so the engine needs no pytest to tell it apart.
    """
    kind = type(error)
    if kind.__name__ == "Skipped" and kind.__module__.startswith("_pytest"):
        return str(getattr(error, "msg", error))
    return None


class OpRaised(Exception):
    """The op (or its backward) raised; carries a short, user-facing description."""

    def __init__(self, phase, error):
        self.phase = phase
        self.error = error
        super().__init__(f"{phase} raised {type(error).__name__}: {error}")

    def where(self):
        frames = traceback.extract_tb(self.error.__traceback__)
        user = [f for f in frames if "/torch/" not in f.filename and "pytest_autograd" not in f.filename]
        if not user:  # raised inside torch (e.g. the engine rejecting a gradient's shape): torch's message says it
            return None
        frame = user[-1]
        return f"{frame.filename}:{frame.lineno} in {frame.name}"


def raised_by_op(phase, error):
    """The exception for an error the op raised in ``phase``: :class:`~pytest_autograd.engine.device_faults.
    DeviceFault` for a GPU fault (never taken for a refusal), else :class:`OpRaised`."""
    from pytest_autograd.engine.device_faults import DeviceFault, is_device_fault  # only once an op has run

    if isinstance(error, DeviceFault):
        return error
    return DeviceFault(phase, error) if is_device_fault(error) else OpRaised(phase, error)
