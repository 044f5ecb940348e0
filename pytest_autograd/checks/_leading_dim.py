"""One more leading dim: a sample's activations as a model hands them to the op.

Kernels are sampled on ``(rows, features)`` and called on ``(batch,
sequence, features)``. Written for two dims, a backward reduces over
``dim=1`` where the forward reduces over the last dim, a forward reads the
feature count from ``shape[1]`` or its rows as ``x.reshape(x.shape[0], -1)``,
a wrapper flattens the rows and forgets to restore the shape: each is right
at every 2-D size and wrong for every 3-D activation.

The variant stacks two copies of the activation (the first floating tensor
argument of two or more dims) along a new dim 0: ``(8, 16)`` becomes
``(2, 8, 16)``, and every other dim keeps its meaning (a position table
still matches its sequence, a weight its features). Weights and tables are
passed as they are; only when the op refuses that are the other tensor
arguments whose shape begins like the activation's (a target per row, a
mask per row) stacked with it. Two judgements follow, neither of which
compares the op with the reference at three dims, where the reference may
mean something else (``F.cross_entropy`` reads dim 1 of a 3-D input as the
classes):

* each copy of an output that carries the new dim equals the op's output
  on the sample, where ``reference=`` reads the new dim that way too (its
  own copies equal its output on the sample). Ops that follow torch's
  channels-first convention (a group norm, a convolution: dim 1 is the
  channels) mean something else by a leading dim, as do ops that reduce or
  scan over dim 0 by design (batch statistics, a cumsum) or take
  ``dim=1``; their references do too, and the copies are not compared. An
  output reduced over the new dim (a summed loss) is not compared either:
  sum or mean is the op's choice;
* the backward is the derivative of the forward there (``_size_judge``'s
  finite differences, without the reference).

A wrong verdict fails the op only with evidence that it is meant to take one
more dim (``engine.exploration.verdicts``): its forward treats the new dim as
a batch (its outputs there are copies of its outputs on the sample, or their
sum or mean), ``reference=`` reads it as one, or ``reference=`` agrees with
the op's forward there. An op written for a fixed rank (a ``(B, T, C)``
token op, an ``(N, C)`` loss) that accepts one more dim without batching
over it gets a note instead.
"""

import math
from dataclasses import dataclass, field

import torch

from pytest_autograd.checks._size_judge import REFUSED, RIGHT, WRONG, Verdict, refusal
from pytest_autograd.engine.execution import OpRaised, output_label
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import compare_tensors

COPIES = 2
BATCHED = ("its forward treats the new dim as a batch (its outputs there are copies of its outputs on the sample, or "
           "their sum or mean)")
HOW = ("to judge it, add a sample with that many dims to the test (every check judges the samples' own shapes), or "
       "a reference= that takes them; if the op takes only its sample's number of dims, make it raise for others")
MOVED, TOWARDS = 0.25, 0.5 + 1 / 29  # a one-row first copy moves this far towards that point of its range
STRATEGY = "each copy's outputs against the op's own on the sample (copies of it along a new dim 0)"
HINT = ("the op (or its backward) is written for the sample's number of dims: read sizes from the end "
        "(x.shape[-1], not x.shape[1]), reduce over dim=-1, not dim=1, flatten the leading dims before a kernel that "
        "expects rows (x.reshape(-1, x.shape[-1])) and restore them after (out.view(*x.shape[:-1], -1)); if the op "
        "supports only this number of dims by design, make it raise for others (a refused variant is noted, not "
        "failed)")


@dataclass
class LeadingDim:
    """A sample with copies of its activation (and of ``names[1:]``) stacked along a new dim 0."""

    sample: object
    slots: list  # the arguments stacked, the activation first ...
    names: list  # ... and their names
    before: tuple  # the activation's shape in the sample the variant was taken on ...
    after: tuple  # ... and in the variant
    cut_from: tuple = None  # the activation's shape in the user's sample, when the variant was taken on it cut
    notes: list = field(default_factory=list)

    def describe(self):
        others = f" (and {', '.join(f'`{name}`' for name in self.names[1:])})" if len(self.names) > 1 else ""
        before = _shape(self.before) + (f" (your {_shape(self.cut_from)}, cut)" if self.cut_from else "")
        return f"when `{self.names[0]}`{others} gets one more leading dim: {before} as {_shape(self.after)}"


def leading_variants(case, base, sample):
    """The LeadingDims to try on ``base`` (``sample`` cut), in order: each candidate activation alone, then with the
    arguments that go with its rows; empty when no floating tensor argument has two or more dims."""
    arguments = list(zip(base.slots(), base.values()))
    candidates = [slot for slot, value in arguments if isinstance(value, torch.Tensor) and value.dim() >= 2
                  and (value.is_floating_point() or value.is_complex())][:2]
    variants = []
    for lead_slot in candidates:
        lead = base.args[lead_slot] if isinstance(lead_slot, int) else base.kwargs[lead_slot]
        rows = [slot for slot, value in arguments if slot != lead_slot and isinstance(value, torch.Tensor)
                and value.dim() >= 1 and tuple(value.shape) == tuple(lead.shape[:value.dim()])]
        for stacked in ([lead_slot], [lead_slot, *rows]) if rows else ([lead_slot],):
            variants.append(_stacked(case, base, sample, stacked))
    return variants


def _stacked(case, base, sample, slots):
    def change(slot, value):
        if slot in slots:
            return torch.stack([value.detach()] * COPIES)
        return value

    changed = base.map(change)
    lead = dict(zip(base.slots(), base.values()))[slots[0]]
    own = dict(zip(sample.slots(), sample.values()))[slots[0]]
    return LeadingDim(changed, list(slots), [case.arg_name(slot) for slot in slots], tuple(lead.shape),
                      (COPIES, *lead.shape), tuple(own.shape) if own.shape != lead.shape else None)


def judge(context, judge, base, variant, reference, surrogate=False):
    """The Verdict of the op on ``variant``: its copies against the op on ``base`` (when ``reference`` reads the new
    dim as copies too), then its derivatives (``judge``, a ``_size_judge.Judge`` without a reference) with the
    first copy moved off the second: exact copies tie every element with its copy, and an op selecting along the
    new dim (a max over dim 0) has no derivative at a tie. Its ``grounds`` say what shows the op is meant to take
    the new dim."""
    dtype = judge.dtype
    try:
        expected = [out.detach() for out in context.run_op(context.prepare(base, dtype=dtype))]
    except (OpRaised, UsageProblem) as raised:
        refused = refusal(raised)
        refused.reason = f"it refuses the sample cut, before any dim is added: {refused.reason}"
        return refused
    finally:
        context.dtype = dtype
    try:
        got = [out.detach() for out in context.run_op(context.prepare(variant.sample, dtype=dtype))]
    except (OpRaised, UsageProblem) as raised:
        return refusal(raised)
    finally:
        context.dtype = dtype
    at_sample, at_variant = _reference_runs(context, reference, base, variant, dtype) if reference is not None \
        else (None, None)
    references = at_variant if at_sample is not None and _copies_of(context, at_sample, at_variant) else None
    grounds = _grounds(context, expected, got, references, at_variant)
    if references is not None:
        wrong = _copies_differ(context, variant, expected, got, references)
        if wrong is not None:
            wrong.grounds = grounds
            return wrong
    if surrogate:  # the backward is declared not to be the forward's derivative: only the copies can be judged
        return Verdict(RIGHT) if references is not None else Verdict(
            REFUSED, reason="a surrogate gradient is judged against reference= only, which reads the new dim otherwise")
    verdict = judge.at(_moved_apart(context.case, variant))
    verdict.notes = variant.notes + verdict.notes
    verdict.grounds = grounds
    return verdict


def missing(reference):
    """Why nothing shows that an op without ``_grounds`` is meant to take one more leading dim."""
    other = ("reference= neither reads it as one nor agrees with the op there" if reference is not None else
             "there is no reference= to say what the op computes there")
    return (f"its forward does not treat the new dim as a batch (its outputs there are not copies of its outputs on "
            f"the sample, nor their sum or mean), and {other}: nothing shows the op is meant to take one more dim")


def _grounds(context, expected, got, references, reference_got):
    """What shows the op is meant to take the new dim (``engine.exploration.verdicts``), from its forward and the
    reference's on the variant of exact copies."""
    found = []
    if _batched(context, expected, got):
        found.append(BATCHED)
    if references is not None:
        found.append("reference= treats the new dim as a batch (its outputs there are copies of its outputs on the "
                     "sample)")
    elif reference_got is not None and _agree(context, reference_got, got):
        found.append("reference= agrees with the op's forward there")
    return found


def _moved_apart(case, variant):
    """``variant``'s sample with the first copy of every argument it stacked rolled by one row: the sample's own
    values, ties only where the sample ties, and none of an element with its copy. A sample of one row has its
    first copy (of the floating, non-constant arguments) moved a quarter of the way towards a point inside its
    range instead: one affine map, which keeps the ties within the copy."""
    def change(slot, value):
        if slot not in variant.slots or not value.numel():
            return value
        moved = value.clone()
        if value.dim() >= 2 and value.shape[1] > 1:
            moved[0] = value[0].roll(1, 0)
            return moved
        if slot in case.constant_slots or not value.is_floating_point():
            return value
        low, high = (float(v) for v in torch.aminmax(value[0].double()))
        if math.isfinite(low) and math.isfinite(high):
            moved[0] += MOVED * (low + (high - low) * TOWARDS - moved[0])
        return moved

    return variant.sample.map(change)


def _reference_runs(context, reference, base, variant, dtype):
    """The reference's outputs on ``base`` and on ``variant``; (None, None) when it raises on either."""
    try:
        want = [out.detach() for out in context.run_op(context.prepare(base, dtype=dtype), fn=reference)]
        have = [out.detach() for out in context.run_op(context.prepare(variant.sample, dtype=dtype), fn=reference)]
    except (OpRaised, UsageProblem):
        return None, None
    finally:
        context.dtype = dtype
    return want, have


def _copies_of(context, want, have):
    """Whether the reference reads the new dim as a batch of copies: each copy of an output that has the new dim
    equals its output on the sample, for at least one output."""
    stacked = [(expected, got) for expected, got in zip(want, have) if tuple(got.shape) == (COPIES, *expected.shape)]
    return bool(stacked) and all(_close(context, expected, copy) for expected, got in stacked for copy in got.unbind(0))


def _batched(context, expected, got):
    """Whether the op's forward treats the new dim as a batch: each output on the variant of exact copies is
    copies of its output on the sample (along the new dim, or with the leading dims flattened), or has its shape
    and is their mean or sum (a loss)."""
    if not expected or len(expected) != len(got):
        return False
    for want, have in zip(expected, got):
        if tuple(have.shape) == (COPIES, *want.shape):
            copies = have.unbind(0)
        elif want.dim() >= 1 and tuple(have.shape) == (COPIES * want.shape[0], *want.shape[1:]):
            copies = have.split(want.shape[0])
        elif tuple(have.shape) == tuple(want.shape):
            if not (_close(context, want, have) or _close(context, COPIES * want, have)):
                return False
            continue
        else:
            return False
        if not all(_close(context, want, copy) for copy in copies):
            return False
    return True


def _agree(context, reference_got, got):
    """Whether the reference's outputs on the variant equal the op's, output by output."""
    return len(reference_got) == len(got) and all(
        tuple(want.shape) == tuple(have.shape) and _close(context, want, have.to(want.dtype))
        for want, have in zip(reference_got, got))


def _close(context, want, have):
    atol, rtol = _tolerance(context, want)
    return compare_tensors(want, have, atol, rtol) is None


def _tolerance(context, tensor):
    return context.tolerance(tensor.dtype if tensor.is_floating_point() or tensor.is_complex() else torch.float64)


def _copies_differ(context, variant, expected, got, references):
    """A WRONG Verdict for the first output whose copies differ from the op's output on the sample, or whose
    rows are flattened where the reference keeps the new dim and the output has its input's shape at the sample;
    None when none does."""
    for k, (want, have) in enumerate(zip(expected, got)):
        label = output_label(k, len(got))
        atol, rtol = context.tolerance(want.dtype if want.is_floating_point() or want.is_complex() else torch.float64)
        if tuple(have.shape) == (COPIES, *want.shape):
            copies = have.unbind(0)
        elif want.dim() >= 1 and tuple(have.shape) == (COPIES * want.shape[0], *want.shape[1:]):
            kept = k < len(references) and tuple(references[k].shape) == (COPIES, *want.shape)
            if kept and tuple(want.shape) == variant.before:  # the output follows its input's shape, but not here
                return Verdict(WRONG, what=label, output=label, strategy=STRATEGY,
                               worst=f"shape: expected {list(variant.after)} (the input's, as at the sample), got "
                                     f"{list(have.shape)}: the leading dims are flattened")
            variant.notes.append(f"{label} comes back with the leading dims flattened ({list(have.shape)}); compared "
                                 "copy by copy")
            copies = have.split(want.shape[0])
        else:
            continue  # reduced over the new dim, or shaped otherwise: the op's choice
        for copy in copies:
            mismatch = compare_tensors(want, copy, atol, rtol)
            if mismatch is not None:
                return Verdict(WRONG, what=label, output=label, worst=mismatch.worst(label),
                               error=mismatch.error_line(), strategy=STRATEGY)
    return None


def _shape(shape):
    return "(" + ", ".join(str(size) for size in shape) + ("," if len(shape) == 1 else "") + ")"


__all__ = ["HINT", "HOW", "STRATEGY", "LeadingDim", "judge", "leading_variants", "missing"]
