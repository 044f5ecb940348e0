"""Notes: what a user should know about an item that is not a bug.

A changed strategy (an op judged in float32 because it refuses float64), a
reference less precise than the op, a declared surrogate gradient. A note
never fails an item: it is a warning of its own class, listed in pytest's
warnings summary (and in any report that records warnings), so
``-W error::pytest_autograd.notes.AutogradNote`` can still turn notes into
errors where a team wants that.
"""

import warnings


class AutogradNote(UserWarning):
    """Not a failure: how a check judged the op, or why it judged less than usual."""


def note(text):
    warnings.warn(AutogradNote(text), stacklevel=3)
