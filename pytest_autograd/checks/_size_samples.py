"""``size_samples=``: the op's arguments at other sizes, as its caller makes them; sizes judges a sample there only.

A model calls its ops at the sizes it makes: a rotary embedding gets the
head dim its config fixes, whatever the batch or the sequence. Sizes derived
from a sample (an odd head dim) would judge the op where it is never called,
and fail a correct op written for even head dims. Given ``size_samples=``
(the model scan fills it with the arguments each op gets when the model runs
at other input sizes, ``engine/model_sizes``), a sample is judged at those
and nowhere else: no size is derived, no leading dim is added, and a dim
none of them changes is never varied. They are the caller's own calls, so a
mismatch there fails.

Each entry is a ``Sample``, or a ``(Sample, origin)`` pair whose ``origin``
says where the caller makes it (the report quotes it). It belongs to the
first sample of the case with its structure: the same arguments, tensors of
the same number of dims.
"""

import time
from dataclasses import dataclass

import torch

from pytest_autograd.checks._hints import derivative_hint
from pytest_autograd.checks._size_hints import pattern_hint
from pytest_autograd.checks._size_judge import OUTSIDE, REFUSED, RIGHT, WRONG
from pytest_autograd.engine.budget import call_with_limit
from pytest_autograd.engine.case import Sample
from pytest_autograd.engine.exploration import Variant, exploring
from pytest_autograd.engine.outcomes import UsageProblem, skip
from pytest_autograd.results.compare import dtype_label, fmt

EXAMPLE = "size_samples=[Sample(torch.randn(1, 5, 8)), Sample(torch.randn(2, 9, 8))]"


@dataclass
class SizeSample:
    """The op's arguments at other sizes, and the dims whose size differs from the case sample they belong to."""

    sample: Sample
    origin: str  # where the caller calls the op so, or None
    changes: list  # [(argument name, dim, size in the case sample, size here)]

    def describe(self):
        """``when dim 1 of `x` (size 8 in your sample) is 9``, each changed dim once."""
        parts = [f"dim {dim} of `{name}` (size {old} in your sample) is {new}" for name, dim, old, new in self.changes]
        return "when " + " and ".join(parts)

    def ratio(self):
        """How many times larger the most grown dim is (a longer reduction rounds more)."""
        return max(new / old if old else float(new) for _, _, old, new in self.changes)

    def sizes_of(self, name, dim):
        """This sample's size of ``dim`` of ``name``, or None when it keeps the case sample's."""
        return next((new for n, d, _, new in self.changes if (n, d) == (name, dim)), None)


def given_size_samples(case):
    """``size_samples=`` as {case sample index: [SizeSample]}, each paired with the first case sample of its
    structure; None when the option is not given. An entry that changes no size is left out."""
    given = case.option("size_samples")
    if given is None:
        return None
    if isinstance(given, Sample):
        given = [given]
    if not isinstance(given, (list, tuple)):
        raise UsageProblem(f"size_samples= must be a list of Samples (the op's arguments at other sizes), e.g. "
                           f"{EXAMPLE}; got {given!r}.")
    paired = {index: [] for index in range(len(case.samples))}
    for number, entry in enumerate(given):
        sample, origin = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
        if not isinstance(sample, Sample):
            raise UsageProblem(f"size_samples= entry {number} is {type(sample).__name__}, not a Sample of the op's "
                               f"arguments; e.g. {EXAMPLE}.")
        index = next((i for i, own in enumerate(case.samples) if _structure(own) == _structure(sample)), None)
        if index is None:
            raise UsageProblem(f"size_samples= entry {number} ({sample!r}) has the structure of none of your samples "
                               "(the same arguments, tensors of the same number of dims): it can only change sizes.")
        changes = _changes(case, case.samples[index], sample)
        if changes:
            paired[index].append(SizeSample(sample, origin, changes))
    return paired


def judge_size_samples(context, run, given):
    """Judge each sample at its size samples (``given``, from ``given_size_samples``) and nowhere else: fail for the
    first wrong one; skip, saying why, when none could be judged. ``run``: sizes' state of the check run (its judges,
    its pace and its time budget)."""
    if not any(given.values()):
        skip("size_samples= gives no other sizes: the caller (a model run at other input sizes) calls the op at its "
             "sample's sizes only, so there is nothing to judge")
    reasons = []
    for index, items in given.items():
        verdicts = [_judge(context, run, index, item, reasons) for item in items]
        for item, verdict in zip(items, verdicts):
            if verdict is not None and verdict.status == WRONG:
                _report(context, run, index, item, verdict, items, verdicts)
    context.sample_index = None
    if not run.judged:
        skip("no size the caller gives could be judged: " + "; ".join(dict.fromkeys(reasons[:3])))


def _judge(context, run, index, given, reasons):
    """The Verdict at ``given`` (a SizeSample of sample ``index``); None when not run for time (noted)."""
    sample = context.case.samples[index]
    judge = run._judge_for(index, sample)
    context.sample_index = index
    if time.monotonic() >= run.deadline:
        reasons.append("the check's time budget ran out")
        context.note(f"sizes: not judged {given.describe()}: the check's time budget ran out")
        return None
    growth = _elements(given.sample) / max(1, _elements(sample))
    limit = run._limit(index, growth)
    start = time.perf_counter()
    called = f"the caller calls the op at these sizes{' (' + given.origin + ')' if given.origin else ''}"
    with exploring(context, Variant(context.check_name, given.describe(), evidence=(called,))):  # a crash there fails
        finished = call_with_limit(limit, lambda: judge.at(given.sample, given.ratio()))
    context.sample_index = index
    if finished.expired is not None:
        reasons.append(f"stopped after {fmt(limit)} s")
        context.note(f"sizes: not judged {given.describe()}: stopped after {fmt(limit)} s (the check's time budget, "
                     "or far slower than the sizes judged before)")
        return None
    run.first_seconds.setdefault(index, (time.perf_counter() - start, growth))
    verdict = finished.value
    if verdict.status == RIGHT:
        run.judged += 1
    elif verdict.status != WRONG:
        if verdict.status == REFUSED and verdict.raised is not None:
            run._raise_if_the_sample_raises(index, sample, judge)
            context.sample_index = index
        verb = {REFUSED: "the op refuses it", OUTSIDE: "outside the op's domain"}.get(
            verdict.status, "central differences cannot follow the op's outputs there")
        reasons.append(f"{given.describe()}: {verdict.reason}")
        context.note(f"sizes: not judged {given.describe()}: {verb} ({verdict.reason})")
    for line in verdict.notes:
        context.note(f"sizes: {given.describe()}: {line}")
    return verdict


def _report(context, run, index, given, verdict, items, verdicts):
    """Fail for a size the caller calls the op at; skip when the op is wrong at the sample itself too (gradcheck
    reports it there)."""
    judge = run.judges[index]
    at_sample = run.sample_verdict(index)
    context.sample_index, context.dtype = index, judge.dtype
    when = given.describe()
    coarse = context.case.reference is None and judge.dtype != torch.float64
    if at_sample.status == WRONG and not coarse:  # one report per root cause
        skip(f"the op is wrong at your sample's own sizes too ({verdict.what}, and {when}): gradcheck and reference "
             "report it there; sizes judges what depends on the size once the sample is right")
    if at_sample.status == WRONG:  # judged coarsely, gradcheck may miss it: said here
        when = f"at your sample's own sizes too, and {when}"
    observed = _pattern(items, verdicts, at_sample, given)
    details = [given.origin or "a size size_samples= gives: the op is called there"]
    if coarse:
        details.append(f"judged coarsely (central differences in {dtype_label(judge.dtype)}, no reference=): a size "
                       "judged right may be wrong too")
    if verdict.strategy:
        details.append(f"judged by: {verdict.strategy}")
    name, dim = given.changes[0][:2]
    right = sorted(size for size, ok in observed.items() if ok)
    wrong = sorted(size for size, ok in observed.items() if not ok)
    details.append(f"sizes of dim {dim} of `{name}` judged: right at {_join(right) or 'none'}; wrong at {_join(wrong)}")
    hint = None if coarse else pattern_hint(observed)
    if hint is None and verdict.derivative is not None:
        hint = derivative_hint(verdict.derivative, has_backward=context.case.is_function)
    if verdict.raised is not None:
        context.fail_raised(verdict.raised, when, hint=hint or "backward must return each gradient in the shape of "
                            "its input: look for a squeeze(), view or sum that drops a dim of size 1", details=details)
    context.fail(f"{verdict.what} is wrong {when}", output=verdict.output, argument=verdict.argument,
                 worst=verdict.worst, error=verdict.error, details=details, hint=hint, evidence=verdict.evidence,
                 dtype=dtype_label(judge.dtype))


def _pattern(given, verdicts, at_sample, failing):
    """{size: right?} of the first dim ``failing`` changes: the sizes ``given`` has there and the case sample's own
    (``at_sample``, its Verdict), each judged right or wrong."""
    name, dim, old, _ = failing.changes[0]
    observed = {old: at_sample.status == RIGHT} if at_sample.status in (RIGHT, WRONG) else {}
    for size_sample, verdict in zip(given, verdicts):
        size = size_sample.sizes_of(name, dim)
        if size is not None and verdict is not None and verdict.status in (RIGHT, WRONG):
            observed.setdefault(size, verdict.status == RIGHT)
    return observed


def _elements(sample):
    return sum(value.numel() for value in sample.values() if isinstance(value, torch.Tensor))


def _join(sizes):
    return ", ".join(str(size) for size in sizes)


def _structure(sample):
    return [(slot, value.dim() if isinstance(value, torch.Tensor) else type(value).__name__)
            for slot, value in zip(sample.slots(), sample.values())]


def _changes(case, own, sample):
    changes = []
    for slot, value in zip(own.slots(), own.values()):
        other = dict(zip(sample.slots(), sample.values()))[slot]
        if isinstance(value, torch.Tensor):
            changes += [(case.arg_name(slot), dim, old, new) for dim, (old, new) in enumerate(zip(value.shape,
                                                                                                 other.shape))
                        if old != new]
    return changes
