"""What a mismatch on an input the user did not give means: a failure where there is evidence, a note elsewhere.

A check that explores (sizes' other sizes and extra leading dim, extreme's
magnitudes, other layouts) hands the op inputs it never promised to accept.
A mismatch there fails the op only with evidence that the op is meant to work
there: the user's own values in another valid layout, a size the user
declared (``sizes=``) or the model produced, a reference that agrees with the
op or reads the variant as the op should, the op's own forward treating a new
dim as a batch, a yardstick of what the dtype can reach there. The check
finds the evidence; this module rules, and words every unjudged variant
alike::

    sizes: not judged when `x` gets one more leading dim: (4, 8) as (2, 4, 8): <what was seen>;
    <why there is no evidence>; <how to make it a check>

Evidence never outweighs numbers that cannot be trusted: a mismatch against
a truth computed otherwise (float64, a reference) in a dtype Triton's
interpreter computes wrongly, of an op that launched interpreted kernels, is
noted whatever the evidence, with how to judge it (on a GPU). (A layout
compared with the op's own run in the same dtype shares the interpreter's
arithmetic on both sides: ``engine.running`` notes it only where the numbers
look like garbage.)
"""

from dataclasses import dataclass

from pytest_autograd.engine.triton_interpreter import judge_on_a_gpu, untrusted_dtype


@dataclass(frozen=True)
class Mismatch:
    """What a variant showed: where (``at``: "when dim 1 of `x` (size 8 in your sample) is 9", "at max |x| = 177
    in float32"), what was seen there, and the dtype its numbers were computed in (a torch dtype or its label)."""

    at: str
    seen: str
    dtype: object = None


def ruling(mismatch, evidence, missing, how):
    """The note that replaces the failure ``mismatch`` would be, or None when it fails the op.

    ``evidence``: what shows the op is meant to work there (phrases; empty when nothing does). ``missing``: why
    nothing does, and ``how``: what would make the variant a check, for the note.
    """
    untrusted = untrusted_dtype(mismatch.dtype)
    if untrusted:
        return not_judged(mismatch, untrusted, judge_on_a_gpu(_label(mismatch.dtype)))
    if evidence:
        return None
    return not_judged(mismatch, missing, how)


def fails(context, mismatch, evidence=(), missing="", how="", draws_differ=False):
    """Whether ``mismatch`` fails the op (the caller then reports it); otherwise it is noted on ``context``, in the
    check's name, and the check goes on. ``draws_differ``: the runs compared may draw different random numbers;
    a random op's mismatch then fails until its draws are fixed, so that the runner judges it again with them
    fixed (``engine.running``), where this rule applies."""
    if draws_differ and not evidence and not untrusted_dtype(mismatch.dtype) and _draws_not_fixed_yet(context):
        return True
    note = ruling(mismatch, evidence, missing, how)
    if note is None:
        return True
    context.note(f"{context.check_name}: {note}")
    return False


def _draws_not_fixed_yet(context):
    """Whether the op of ``context`` draws from torch's global generator on its sample, and the check runs without
    those draws fixed (``engine.random_draws.FixedDraws``)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from pytest_autograd.engine.random_draws import FixedDraws, draws_from_global_generator

    if any(isinstance(mode, FixedDraws) for mode in _get_current_dispatch_mode_stack()):
        return False
    samples = context.case.samples
    index = context.sample_index
    return any(draws_from_global_generator(context, samples[i])
               for i in ([index] if isinstance(index, int) and index < len(samples) else range(len(samples))))


def not_judged(mismatch, why, how):
    """The uniform words of a variant left unjudged: where, what was seen, why it is not judged, how to judge it."""
    return f"not judged {mismatch.at}: {mismatch.seen}; {why}; {how}"


def evidence_line(evidence):
    """A failure's detail naming the evidence it stands on."""
    return "failed on evidence that the op is meant to work there: " + "; ".join(evidence)


def _label(dtype):
    return str(dtype).replace("torch.", "")


__all__ = ["Mismatch", "evidence_line", "fails", "not_judged", "ruling"]
