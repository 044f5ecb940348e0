"""Notes: what a user should know about a check's verdict that is not a bug.

A changed strategy (an op judged in float32 because it refuses float64), a
reference less precise than the op, input magnitudes outside the op's
domain. A note never fails a check. The engine only collects them (a check
calls ``context.note``; helpers without a context call :func:`note`); the
pytest adapter shows each once, as an :class:`AutogradNote` warning at the
test's own line (never turned into an error, not even by ``-W error``: a
correct op must pass in every setup), in the item's report section and in
its JSON record; ``run_checks`` puts them in the outcome's detail.
"""

_pending = []  # notes of the check running in this process, oldest first


class AutogradNote(UserWarning):
    """Not a failure: how a check judged the op, or why it judged less than usual."""


def note(text):
    _pending.append(str(text))


def pending():
    """The notes made since the last :func:`take`, oldest first, each once (they stay pending)."""
    return list(dict.fromkeys(_pending))


def count():
    """How many notes were made so far: pass it to :func:`since` to read the notes made after this point."""
    return len(_pending)


def since(position):
    """The notes made after ``count()`` returned ``position``, oldest first, without forgetting them."""
    return list(dict.fromkeys(_pending[position:]))


def take():
    """The notes made since the last call, oldest first (and forget them)."""
    taken = pending()
    _pending.clear()
    return taken


def forget_since(position):
    """Forget the notes made after ``count()`` returned ``position`` (runs whose notes are nobody's business)."""
    del _pending[position:]
