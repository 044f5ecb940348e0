"""Exploring inputs the user did not give: the variants checks build, their isolation and their verdicts.

Checks that look past the user's samples (other sizes, one more leading dim,
shrink candidates, other layouts, extreme magnitudes) run the op on inputs it
never promised to accept. Everything that decides how such a run is judged
lives here, not in the checks:

* ``isolation``: each new kind of call runs first in the sandbox process
  (``engine.processes``), so a kernel that segfaults, aborts or faults its GPU
  on it ends that process, not the session; the crash becomes the variant's
  verdict.
* ``verdicts``: what a variant's mismatch or crash means. It fails the op only
  with evidence that the op is meant to work there (the user's own values in
  another valid layout, a size the user declared or the model produced, a
  reference that agrees with the op's forward there); otherwise it is a note
  saying what was seen and how to make it a check.
"""

from contextlib import contextmanager

from pytest_autograd.engine.isolate_modes import ISOLATE_HELP, ISOLATE_MODES, isolate_mode, isolate_problem
from pytest_autograd.engine.exploration.variants import Variant, VariantCrashed, naming

USERS_SAMPLE = "it is your own sample (or the copy of it the check judges in another dtype)"
OWN_VALUES_IN_A_LAYOUT = "these are your own values, in a layout autograd and real models hand an op"


class NotJudged(BaseException):
    """The op crashed on a variant it need not accept: noted, and the variant has no verdict. A BaseException,
    so no ``except Exception`` of a check takes it for the op raising; the check catches it where it moves on
    to its next variant (an item whose check does not is skipped with the note's reason)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


@contextmanager
def exploring(context, variant, narrow=None):
    """Calls of the op in the block are on ``variant``, each new kind tried in the sandbox first. A crash there
    ends the block: a CheckFailure where there is evidence the op must accept it (after ``narrow()``, given for a variant
    that ``narrows``, has tried its parts in blocks of their own, whose crash fails naming the part), else a note
    and NotJudged."""
    from pytest_autograd.engine.exploration import crashes

    try:
        with naming(context, variant):
            yield
    except VariantCrashed as crashed:
        if crashed.variant != variant:
            raise
        if variant.evidence:
            if narrow is not None:
                narrow()
            raise crashes.failure(context, variant, crashed.trial) from None
        crashes.note(context, variant, crashed.trial)
        raise NotJudged(context.notes[-1] if context.notes else variant.situation) from None


CRASHED = object()  # what ``attempt`` returns for a variant the op crashed on and the plugin cannot vouch for


def attempt(context, variant, run, otherwise=CRASHED):
    """``run()`` on ``variant`` (see ``exploring``); ``otherwise`` when the op crashed there and the variant
    has no evidence the op must accept it."""
    try:
        with exploring(context, variant):
            return run()
    except NotJudged:
        return otherwise


@contextmanager
def on_users_sample(context, order=1):
    """The check's calls of the op outside any variant are on the user's own sample: where the check runs in the
    sandbox (``whole_checks``), a crash there fails the check, naming the sample. In the session's process they
    are not tried in the sandbox first (a trial of every kind of call costs more than the checks on small samples
    do): ``isolate="all"`` runs every check in the sandbox."""
    variant = Variant(context.check_name, "on your sample", evidence=(USERS_SAMPLE,), order=order, tried=False)
    try:
        with exploring(context, variant):
            yield
    except Exception as raised:
        _name_the_sample(context, raised)
        raise


def _name_the_sample(context, raised):
    report = getattr(raised, "report", None)
    if report is not None and " on your sample:" in report.summary and context.sample_index is not None:
        report.summary = report.summary.replace(" on your sample:", f" on sample {context.sample_index}:", 1)


def rehearse(context, args, kwargs):
    """Try the op's call on ``args`` in the sandbox now, under the variant being explored (see
    ``isolation.rehearse``)."""
    from pytest_autograd.engine.exploration.isolation import rehearse as trial

    trial(context, args, kwargs)


__all__ = ["CRASHED", "ISOLATE_HELP", "ISOLATE_MODES", "isolate_mode", "isolate_problem", "NotJudged", "OWN_VALUES_IN_A_LAYOUT", "USERS_SAMPLE", "Variant", "attempt", "exploring",
           "on_users_sample", "rehearse"]
