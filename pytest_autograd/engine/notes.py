"""Notes: what a user should know about an item that is not a bug.

A changed strategy (an op judged in float32 because it refuses float64), a
reference less precise than the op, input magnitudes outside the op's
domain. A note never fails an item: it is a warning of its own class,
listed in pytest's warnings summary, in the item's report section (shown
by ``pytest -rP``, written to JUnit XML as properties) and in its JSON
record. A note is never turned into
an error, not even by ``-W error`` or ``filterwarnings = error``: a correct
op must pass in every setup.
"""

import warnings

_pending = []  # notes of the item running in this process, taken into its JSON record


class AutogradNote(UserWarning):
    """Not a failure: how a check judged the op, or why it judged less than usual."""


def note(text):
    _pending.append(str(text))
    with warnings.catch_warnings():
        warnings.simplefilter("always", AutogradNote)
        warnings.warn(AutogradNote(text), stacklevel=3)


def count():
    """How many notes were made so far: pass it to :func:`since` to read the notes made after this point."""
    return len(_pending)


def since(position):
    """The notes made after ``count()`` returned ``position``, oldest first, without forgetting them."""
    return list(dict.fromkeys(_pending[position:]))


def take():
    """The notes made since the last call, oldest first (and forget them)."""
    taken = list(dict.fromkeys(_pending))
    _pending.clear()
    return taken


SECTION = "autograd notes"


def record_notes(item, notes):
    """Show a passing item's notes in its report section and its JUnit XML properties."""
    if not notes:
        return
    item.add_report_section("call", SECTION, "\n".join(notes))
    item.user_properties.extend(("autograd_note", text) for text in notes)
