"""The op and the reference on one sample, in float64 and in the sample's dtype: run by the reference check,
read again by precision.

Both checks compare the op with the reference in float64 and in the
sample's own dtype, along one cotangent, outputs and gradients: the same
four runs. The reference check draws that cotangent once per sample (its
values rounded through the sample's dtype, so both passes use exactly the
same numbers) and, when a pass agrees, keeps what it ran. precision, judging
a sample given in its dtype, then reads the reference's float64 run as its
truth and both runs in the dtype as its own, instead of running them again;
without them (the reference check not run, or failed) it runs its own.
"""

from dataclasses import dataclass

from pytest_autograd.checks._transforms import Run


@dataclass
class Compared:
    """One pass of the reference check that agreed: both runs and the cotangents (float64, per output)."""

    op: Run
    reference: Run
    cotangents: list


def keep(context, index, dtype, compared):
    """Remember an agreeing pass of sample ``index`` in ``dtype`` on the context's device."""
    context.case.__dict__.setdefault("_reference_runs", {})[(index, str(context.device), dtype)] = compared


def kept(context, index, dtype):
    """The reference check's agreeing pass of sample ``index`` in ``dtype`` on the context's device, or None."""
    return context.case.__dict__.get("_reference_runs", {}).get((index, str(context.device), dtype))


__all__ = ["Compared", "keep", "kept"]
