"""sizes: gradients right at the sizes the samples do not have: tails, ones, odd and large sizes.

Kernels are tested at the sizes their authors think of, usually powers of
two, and are wrong at the others: the last, partial block whose mask is off,
a grid that forgets the last program, a split boundary, a reduction right
only while the row fits one block, a batch of one squeezed away. Each
distinct dimension size of each sample (see ``_size_variants``) is changed
consistently across the arguments that share it to size + 1, size - 1, 1,
an odd size just past a power of two, 11, 19 and 45 (rows that fit half a
warp, a warp or two take their own path in many kernels) and a size
spanning several blocks (or to the sizes ``sizes=`` gives), and the op is judged there in the strategy
that applies to it (``_size_judge``). Then each sample is judged once more
with one more leading dim (``_leading_dim``): a 3-D activation for an op
sampled on rows. A size the op refuses (raises) is
noted, never failed; an op that accepts none is skipped, saying why.

The most telling variants run first, within a time budget; a variant far
slower than the first one is stopped, and the larger sizes of its dim with it.
On a large sample the other sizes are cut while one size is varied (see
``_size_variants``), so the check costs about the same at any sample size.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._hints import derivative_hint
from pytest_autograd.checks._leading_dim import HINT as LEADING_HINT
from pytest_autograd.checks._leading_dim import HOW as LEADING_HOW
from pytest_autograd.checks._leading_dim import STRATEGY as LEADING_STRATEGY
from pytest_autograd.checks._leading_dim import judge as judge_leading_dim
from pytest_autograd.checks._leading_dim import leading_variants
from pytest_autograd.checks._leading_dim import missing as leading_missing
from pytest_autograd.checks._size_hints import pattern_hint
from pytest_autograd.checks._size_samples import given_size_samples, judge_size_samples
from pytest_autograd.checks._size_judge import (
    COMPILE_SECONDS,
    INVALID_GRADIENT,
    NOTED,
    OUTSIDE,
    REFUSED,
    RIGHT,
    UNRESOLVED,
    WRONG,
    Judge,
    Verdict,
    first_call_may_compile,
    size_ratio,
)
from pytest_autograd.checks._size_variants import (
    DECLARED,
    LARGE,
    PRIORITY,
    axes_of,
    check_requested_sizes_occur,
    cut_all,
    cut_base,
    describe_cut_list,
    describe_cuts,
    growth,
    requested_sizes,
    variant,
)
from pytest_autograd.checks._surrogate import OPTION, surrogate_reason
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.budget import call_with_limit
from pytest_autograd.engine.device_faults import DeviceFault
from pytest_autograd.engine.exploration import NotJudged, Variant, attempt, exploring, verdicts
from pytest_autograd.engine.exploration.verdicts import Mismatch
from pytest_autograd.engine.execution import has_floating_input
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.results.compare import dtype_label, fmt

SECONDS = 60.0  # all variants of an item, at most (and at most half the item's own budget)
VARIANT_SECONDS = 2.0  # each variant may take at least this long (on a GPU, plus a compile at its new shape) ...
VARIANT_SLOWDOWN = 50.0  # ... or this many times the sample's first variant took, per element
LARGE_SECONDS = 1.0  # a several-blocks size whose judging would take longer is made smaller ...
LEADING_ELEMENTS = 1 << 11  # the leading dim is added to the sample cut to this many elements (a rank bug shows at any)
PROBE_SECONDS = 0.25  # ... as timed by one forward there, stopped after this long
AT_YOUR_RANK = ("a size of a dim your sample has, at your sample's number of dims, which the op accepts (a size it "
                "does not support should raise, or be left out with sizes=)")
MADE_UP = "the plugin made that size up, and the op need not accept it (an index argument may still point past it)"
DECLARE = "sizes= on the marker declares the sizes the op must accept"
NOT_SUPPORTED = ("if the op does not support size {size} by design, make it raise there (a size the op refuses is "
                 "noted, not failed), or declare what it supports on the marker: sizes={{{sample}: [...]}} with the "
                 "sizes to try, or sizes={{{sample}: None}} to keep it fixed")


@dataclass
class Task:
    """One variant to judge: sample ``index``, its ``axis`` at ``size``."""

    index: int
    axis: object
    size: int
    kind: str


class Sizes(Check):
    name = "sizes"
    explores = True  # builds inputs the user did not give: judged by engine.exploration, run in the sandbox
    description = ("gradients right at sizes the samples do not have: each dimension size at +1, -1, 1, an odd size "
                   "past a power of two, 11/19/45, a multi-block size, and with one more leading dim")
    options = {"sizes": None, "size_samples": None, "dtypes": None, **OPTION}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument whose sizes could change"
        if case.reference is None:
            return surrogate_reason(case, self.name)
        return None

    def run(self, context):
        case = context.case
        given = given_size_samples(case)
        if given is not None:  # the caller's own calls at other sizes (a model's): judged there and nowhere else
            return judge_size_samples(context, _Run(context, {}), given)
        requested = requested_sizes(case)
        check_requested_sizes_occur(case, requested)
        axes = {index: axes_of(case, sample, requested) for index, sample in enumerate(case.samples)}
        tasks = sorted((Task(index, axis, size, kind) for index, found in axes.items() for axis in found
                        for size, kind in axis.sizes),
                       key=lambda t: (PRIORITY.index(t.kind), t.index, t.axis.size, t.size))
        if not tasks:
            skip(_nothing_to_vary(axes))
        for index, found in axes.items():
            for axis in found:
                if axis.fixed and not axis.fixed.startswith("sizes="):
                    context.sample_index = index
                    context.note(f"sizes: {_dim(axis)} (size {axis.size} in your sample) kept: {axis.fixed}")
        context.sample_index = None
        run = _Run(context, axes)
        for task in tasks:
            verdict = run.judge(task)
            if verdict is not None and verdict.status == WRONG:
                run.notes_out()
                _report(context, run, task, verdict)
        for index in range(len(case.samples)):
            verdict = run.judge_leading(index)
            if verdict is not None and verdict.status == WRONG:
                run.notes_out()
                _report_leading(context, run, index, verdict)
        run.notes_out()
        if not run.judged:
            skip("no size variant could be judged: " + "; ".join(run.reasons()))


class _Run:
    """The state of one check run: judges per sample, what each variant showed, and the time budget."""

    def __init__(self, context, axes):
        self.context, self.axes = context, axes
        seconds = context.case.run_options.seconds if context.case.run_options is not None else None
        self.deadline = time.monotonic() + (min(SECONDS, 0.5 * seconds) if seconds else SECONDS)
        self.judges, self.first_seconds, self.stopped = {}, {}, {}
        self.seen = {}  # (index, axis size) -> {size: Verdict}
        self.extra_notes = []
        self.reduced = []  # (task, what was done, why): several-blocks sizes made smaller for time
        self.judged = 0
        self.unrun = []
        self.sample_checked = set()  # samples whose own run was checked after a refused variant
        self.bases = {}  # (index, axis size) -> the sample with that axis' cuts
        self.variants = {}  # (index, axis size, size) -> the last variant made (timed, then judged)
        self.sample_verdicts = {}  # index -> the Verdict at the sample itself (judged only to explain a failure)
        self.leading = {}  # index -> (LeadingDim, the sample cut where it was taken, the cuts, its Judge)

    def judge(self, task, pattern=False):
        """The Verdict at ``task`` (None when not run for time); recorded for the notes and the hints."""
        key = (task.index, task.axis.size)
        seen = self.seen.setdefault(key, {})
        if task.size in seen:
            return seen[task.size]
        if task.size >= self.stopped.get(key, float("inf")) or time.monotonic() >= self.deadline:
            if not pattern:
                self.unrun.append(task)
            return None
        context = self.context
        context.sample_index = task.index
        sample = context.case.samples[task.index]
        judge = self._judge_for(task.index, sample)
        asked = task
        try:
            with _trying(context, task):
                task = self._affordable(task, sample, judge)
            if task is None:
                return None
            shaped = self.shaped(task.index, task.axis, task.size)
            elements = growth(sample, task.axis, task.size)
            first = self.first_seconds.get(task.index)
            limit = self._limit(task.index, elements)
            start = time.perf_counter()
            with _trying(context, task):
                finished = call_with_limit(limit, lambda: judge.at(shaped, size_ratio(task.axis.size, task.size)))
        except NotJudged as crashed:  # noted where it crashed; the other sizes go on
            seen[asked.size] = Verdict(NOTED, reason=crashed.reason)
            return seen[asked.size]
        context.sample_index = task.index
        if finished.expired is not None:
            self.stopped[key] = task.size
            why = ("the check's time budget ran out" if first is None else
                   "far slower than the sample's first variant, even for its number of elements")
            self.extra_notes.append((task, f"stopped after {fmt(limit)} s at {task.size} ({why}); larger sizes of "
                                           "this dim not judged"))
            return None
        seconds = time.perf_counter() - start
        self.first_seconds.setdefault(task.index, (seconds, elements))
        verdict = finished.value
        if verdict.status == WRONG and not pattern and not verdicts.fails(
                context, Mismatch(_when(task), _seen(verdict), judge.dtype), _grounds(task)):
            verdict = Verdict(NOTED, reason="a mismatch noted, not judged (see the note)")
        seen[task.size] = verdict
        if verdict.status == REFUSED and verdict.raised is not None and task.size != task.axis.size:
            self._raise_if_the_sample_raises(task.index, sample, judge)
        if verdict.status == RIGHT and task.size != task.axis.size:
            self.judged += 1
        for line in verdict.notes:
            self.extra_notes.append((task, f"at {task.size}: {line}"))
        return verdict

    def _limit(self, index, elements):
        """Seconds a variant of sample ``index`` with ``elements`` x its elements may take: the first variant of a
        sample sets the pace for the others."""
        first = self.first_seconds.get(index)
        limit = self.deadline - time.monotonic()
        if first is not None:
            floor = VARIANT_SECONDS + (COMPILE_SECONDS if first_call_may_compile(self.context.device) else 0.0)
            limit = min(limit, max(floor, VARIANT_SLOWDOWN * first[0] * max(1.0, elements / first[1])))
        return max(0.1, limit)

    def judge_leading(self, index):
        """The Verdict of sample ``index`` with one more leading dim (``_leading_dim``), taken with its sizes cut:
        the first variant the op does not refuse; None when there is none to try or the time budget ran out
        (noted)."""
        context = self.context
        sample = context.case.samples[index]
        base, cuts = cut_all(context.case, sample, self.axes[index], LEADING_ELEMENTS)
        variants = leading_variants(context.case, base, sample)
        if not variants:
            return None
        context.sample_index = index
        if time.monotonic() >= self.deadline:
            context.note(f"sizes: not judged {variants[0].describe()}: the check's time budget ran out")
            return None
        judge = Judge(context, sample, self._judge_for(index, sample).plan)
        judge.reference = None  # at three dims the reference may mean something else: the op is judged by itself
        limit = self._limit(index, _elements(base) / max(1, _elements(sample)))
        surrogate = surrogate_reason(context.case, self.context.check_name) is not None
        tried = []  # (LeadingDim, Verdict), in order
        for leading in variants:
            variant = Variant(context.check_name, leading.describe(), missing=MADE_UP, how=DECLARE)
            crashed = Verdict(NOTED, reason="crashed (noted)")
            finished = call_with_limit(limit, lambda: attempt(context, variant, lambda: judge_leading_dim(  # noqa: B023
                context, judge, base, leading, context.case.reference, surrogate=surrogate), otherwise=crashed))
            context.sample_index = index
            if finished.expired is not None:
                context.note(f"sizes: not judged {leading.describe()}: stopped after {fmt(limit)} s (the check's time "
                             "budget, or far slower than the other variants)")
                return None
            tried.append((leading, finished.value))
            if not _try_on(finished.value, leading, variants):
                break
        # The first that is neither refused nor a gradient shaped like an argument left unstacked; else the first
        # refused one, the activation's own (autograd's complaint about an unstacked argument's shape says nothing
        # when stacking it is refused)
        judged = [(lead, v) for lead, v in tried if not _try_on(v, lead, variants)]
        leading, verdict = judged[0] if judged else next((lead, v) for lead, v in tried if v.status == REFUSED)
        self.leading[index] = (leading, base, cuts, judge)
        if verdict.status == RIGHT:
            self.judged += 1
        elif verdict.status not in (WRONG, NOTED):  # a crash (NOTED) was noted where it happened
            if verdict.status == REFUSED and verdict.raised is not None:
                self._raise_if_the_sample_raises(index, sample, self._judge_for(index, sample))
                context.sample_index = index
            verb = {REFUSED: "the op refuses it", OUTSIDE: "outside the op's domain"}.get(
                verdict.status, "central differences cannot follow the op's outputs there")
            context.note(f"sizes: not judged {leading.describe()}: {verb} ({verdict.reason})")
        for line in verdict.notes:
            context.note(f"sizes: {leading.describe()}: {line}")
        return verdict

    def base(self, index, axis):
        """The sample with ``axis``' cuts, where its variants are taken (the sample itself without cuts)."""
        key = (index, axis.size)
        if key not in self.bases:
            self.bases[key] = cut_base(self.context.case, self.context.case.samples[index], axis)
        return self.bases[key]

    def shaped(self, index, axis, size):
        """The sample with ``axis`` at ``size`` (its cuts applied), made once: a several-blocks size is timed on the
        very variant it is then judged on."""
        if size == axis.size:
            return self.base(index, axis)
        key = (index, axis.size, size)
        if key not in self.variants:
            generator = torch.Generator().manual_seed(hash((self.context.seed, index, axis.size, size)) % (2 ** 63))
            self.variants = {key: variant(self.context.case, self.base(index, axis), axis, size, generator)}
        return self.variants[key]

    def sample_verdict(self, index):
        """The Verdict at sample ``index`` itself, uncut."""
        if index not in self.sample_verdicts:
            sample = self.context.case.samples[index]
            self.sample_verdicts[index] = self._judge_for(index, sample).at(sample)
            self.context.sample_index = index
        return self.sample_verdicts[index]

    def _raise_if_the_sample_raises(self, index, sample, judge):
        """An op that raises at its own sample fails every check the same way (one report per root cause):
        that is no refused size."""
        if index in self.sample_checked:
            return
        self.sample_checked.add(index)
        verdict = judge.at(sample)
        self.context.sample_index = index
        if verdict.status == REFUSED and verdict.raised is not None:
            raise verdict.raised

    def _affordable(self, task, sample, judge):
        """``task``, or for a several-blocks size whose judging would take over LARGE_SECONDS (one forward there,
        timed, times the evaluations the strategy needs), the largest such size that would not; None, noted, when
        none is left above the other sizes. No forward is timed where the sample's first variant, scaled by
        elements, took a sixteenth of LARGE_SECONDS or less."""
        if task.kind != LARGE:
            return task
        first = self.first_seconds.get(task.index)
        if first is not None and first[0] * growth(sample, task.axis, task.size) / first[1] <= LARGE_SECONDS / 16:
            return task  # the first variant, scaled by elements, says it is cheap (with room for a quadratic cost)
        smallest = max([2 * task.axis.size + 1] + [size for size, kind in task.axis.sizes if kind != LARGE])
        size, why = task.size, None
        for _ in range(4):
            shaped = self.shaped(task.index, task.axis, size)
            seconds = judge.forward_seconds(shaped, PROBE_SECONDS, enough=LARGE_SECONDS / judge.evaluations)
            if seconds is not None and seconds * judge.evaluations <= LARGE_SECONDS:
                break
            why = (f"one forward at {size} takes {'over ' + fmt(PROBE_SECONDS) if seconds is None else f'{seconds:.2g}'}"
                   f" s and judging a size about {judge.evaluations} of them")
            shrink = 0.25 if seconds is None else LARGE_SECONDS / (seconds * judge.evaluations)
            target = growth(sample, task.axis, size) * shrink
            low, high = smallest, size
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if growth(sample, task.axis, middle) <= target else (low, middle)
            size = (low - 3) // 8 * 8 + 3
            if size <= smallest:
                self.reduced.append((task, "not judged", why))
                return None
        else:
            self.reduced.append((task, "not judged", why))
            return None
        if size != task.size:
            self.reduced.append((task, f"{size} instead", why))
        return Task(task.index, task.axis, size, LARGE)

    def _judge_for(self, index, sample):
        if index not in self.judges:
            plan = float64_plan(self.context, sample)
            self.judges[index] = Judge(self.context, sample, plan)
            if plan is not None:
                self.context.sample_index = None
                self.context.note(f"sizes: {plan.reason}; each size judged by {self.judges[index].strategy}")
                self.context.sample_index = index
        return self.judges[index]

    def pattern(self, task):
        """{size: right?} for the failing dim: its planned sizes (the several-blocks one only if judged already), half,
        twice and the sample's own size."""
        axis = task.axis
        seen = self.seen.get((task.index, axis.size), {})
        sizes = [size for size, kind in axis.sizes if kind != LARGE or size in seen] + [axis.size, 2 * axis.size]
        if axis.size % 2 == 0 and axis.size >= 4:
            sizes.append(axis.size // 2)
        observed = {}
        for size in sorted(set(sizes)):
            verdict = self.judge(Task(task.index, axis, size, "pattern"), pattern=True)
            if verdict is not None and verdict.status in (RIGHT, WRONG):
                observed[size] = verdict.status == RIGHT
        return observed

    def notes_out(self):
        """Refused, outside and unjudged sizes, one note per dim of a sample; then the judges' own notes."""
        context = self.context
        for (index, size), seen in self.seen.items():
            axis = next(a for a in self.axes[index] if a.size == size)
            for status, verb in ((REFUSED, "the op refuses"), (OUTSIDE, "outside the op's domain"),
                                 (UNRESOLVED, "central differences cannot follow the op's outputs at")):
                found = {s: v for s, v in seen.items() if v.status == status}
                if not found:
                    continue
                reasons = list(dict.fromkeys(v.reason for v in found.values()))
                context.sample_index = index
                context.note(f"sizes: {_dim(axis)} (size {size} in your sample): {verb} "
                             f"{_join(sorted(found))} ({reasons[0]}{'; ...' if len(reasons) > 1 else ''}){_with(axis)}: "
                             "not judged there")
        for task, line in self.extra_notes:
            context.sample_index = task.index
            context.note(f"sizes: {_dim(task.axis)} (size {task.axis.size} in your sample) {line}")
        self.extra_notes.clear()
        unrun = {}
        for task in self.unrun:
            unrun.setdefault((task.index, task.axis.size), []).append(task)
        for (index, size), tasks in unrun.items():
            context.sample_index = index
            context.note(f"sizes: {_dim(tasks[0].axis)} (size {size} in your sample): "
                         f"{_join(sorted(t.size for t in tasks))} not judged: the check's time budget ran out")
        self.unrun.clear()
        context.sample_index = None
        if self.reduced:
            context.note("sizes: the several-blocks sizes were made smaller to stay within the time budget (as for a "
                         "kernel run by Triton's interpreter): " + "; ".join(
                             f"sample {task.index}, {_dim(task.axis)} (size {task.axis.size}): {what} of "
                             f"{task.size} ({why})" for task, what, why in self.reduced))
        self.reduced.clear()

    def reasons(self):
        found = []
        for (index, size), seen in self.seen.items():
            axis = next((a for a in self.axes.get(index, ()) if a.size == size), None)
            where = f"{_dim(axis)} (size {size})" if axis is not None and axis.tensor_places else f"size {size}"
            for tried, verdict in seen.items():
                if verdict.reason:
                    found.append(f"sample {index}, {where} at {tried}: {verdict.reason}")
        return list(dict.fromkeys(found))[:3] or ["every variant ran out of time"]


def _blind_in_float64(context, index):
    """Whether a float64 verdict of "wrong at the sample" may be float64's blindness, not the op's mistake: the
    sample is given below float64 and the op computes (part of) it in float32. The failure then stands, and the
    runner judges the check again in float32 (``engine/running``), instead of deferring to gradcheck."""
    if context.dtype != torch.float64:
        return False
    from pytest_autograd.checks._float32_blind import float32_instead

    return float32_instead(context, context.case.samples[index]) is not None  # None for a sample given in float64


@contextmanager
def _trying(context, task):
    """The block runs the op at ``task``'s size: each new kind of call there is tried in the sandbox first, and a GPU
    fault names the size."""
    declared = f"sizes= on the marker declares {task.size}" if task.kind == DECLARED else None
    variant = Variant(context.check_name, _when(task), evidence=(declared,) if declared else (), missing=MADE_UP,
                      how=DECLARE)
    with _naming_the_size_of_a_fault(task), exploring(context, variant):
        yield


@contextmanager
def _naming_the_size_of_a_fault(task):
    """A GPU fault while judging ``task`` says at which size it came (a kernel writing past its last block)."""
    try:
        yield
    except DeviceFault as fault:
        fault.situation = f"when {task.axis.tensor_places[0].describe()} (size {task.axis.size} in your sample) is " \
                          f"{task.size}"
        raise


def _report(context, run, task, verdict):
    axis = task.axis
    context.sample_index = task.index
    observed = run.pattern(task)
    context.sample_index = task.index
    context.dtype = run.judges[task.index].dtype
    place = axis.where(verdict.argument)
    dim = f"dim {place.dim}" if place.name == verdict.argument else f"dim {place.dim} of `{place.name}`"
    when = f"when {dim} (size {axis.size} in your sample) is {task.size}"
    wrong_at_sample = observed.get(axis.size) is False
    if wrong_at_sample and axis.cuts and run.sample_verdict(task.index).status == RIGHT:
        _report_cuts(context, run, task)
    coarse = context.case.reference is None and context.dtype != torch.float64
    if wrong_at_sample and not coarse and not _blind_in_float64(context, task.index):
        # one report per root cause, as precision does for a maths error
        skip(f"the op is wrong at your sample's own sizes too ({verdict.what}, and {when}): gradcheck and "
             "reference report it there; sizes judges what depends on the size once the sample is right")
    details = []
    if wrong_at_sample:  # without a float64 judge gradcheck's probes may miss what these variants saw: say it here
        when = f"at your sample's own sizes too, and {when}"
    if coarse:
        details.append(f"judged coarsely (central differences in {dtype_label(context.dtype)}, no "
                       "reference=): a size judged right may be wrong too, and gradcheck, judging the same way, may "
                       "miss it; reference= (any float64 formula) gives a float64 judge")
    if axis.cuts:
        details.append(f"judged with the other sizes cut to keep the variant small ({describe_cuts(axis)})"
                       + ("" if wrong_at_sample else f"; right there at size {axis.size}"))
    if len(axis.places) > 1:
        details.append(f"changed together: {axis.together()}")
    if verdict.strategy:
        details.append(f"judged by: {verdict.strategy}")
    if observed:
        right = sorted(s for s, ok in observed.items() if ok)
        wrong = sorted(s for s, ok in observed.items() if not ok)
        details.append(f"sizes judged for this dim: right at {_join(right) or 'none'}; wrong at {_join(wrong)}")
    if not wrong_at_sample:  # a size pattern or an unsupported size says nothing about a bug at every size
        details.append(NOT_SUPPORTED.format(size=task.size, sample=axis.size))
    hint = None if wrong_at_sample or coarse else pattern_hint(observed)
    if hint is None and verdict.derivative is not None:
        hint = derivative_hint(verdict.derivative, has_backward=context.case.is_function)
    if verdict.raised is not None:
        context.fail_raised(verdict.raised, when, hint=hint or "backward must return each gradient in the shape of "
                            "its input: look for a squeeze(), view or sum that drops a dim of size 1",
                            details=details)
    context.fail(f"{verdict.what} is wrong {when}", output=verdict.output, argument=verdict.argument,
                 worst=verdict.worst, error=verdict.error, details=details, hint=hint, evidence=verdict.evidence,
                 dtype=dtype_label(run.judges[task.index].dtype))


def _report_cuts(context, run, task):
    """Fail for a variant base whose cuts alone make the op wrong while the sample itself is right."""
    axis = task.axis
    verdict = run.seen[(task.index, axis.size)][axis.size]
    context.sample_index = task.index
    context.dtype = run.judges[task.index].dtype
    when = "when " + " and ".join(f"{other.tensor_places[0].describe()} (size {other.size} in your sample) is {size}"
                                  for other, size in axis.cuts)
    details = [f"right at your sample's sizes; the other sizes were cut to vary {_dim(axis)} cheaply, and the op is "
               "wrong with the cuts alone"]
    if verdict.strategy:
        details.append(f"judged by: {verdict.strategy}")
    hint = derivative_hint(verdict.derivative, has_backward=context.case.is_function) \
        if verdict.derivative is not None else None
    if verdict.raised is not None:
        context.fail_raised(verdict.raised, when, hint=hint, details=details)
    context.fail(f"{verdict.what} is wrong {when}", output=verdict.output, argument=verdict.argument,
                 worst=verdict.worst, error=verdict.error, details=details, hint=hint, evidence=verdict.evidence,
                 dtype=dtype_label(run.judges[task.index].dtype))


def _report_leading(context, run, index, verdict):
    """Fail for the variant with one more leading dim; or, when the sample cut for it is wrong already, for that."""
    variant, base, cuts, judge = run.leading[index]
    context.sample_index, context.dtype = index, judge.dtype
    when, details, hint = variant.describe(), [], LEADING_HINT
    grounds, missing = verdict.grounds, leading_missing(context.case.reference)
    if cuts:
        details.append(f"judged with the sample's sizes cut to keep the variant small ({describe_cut_list(cuts)})")
    if verdict.raised is None and verdict.strategy != LEADING_STRATEGY:
        at_base = judge.at(base)
        context.sample_index = index
        if at_base.status == WRONG:
            if not cuts:
                skip(f"the op is wrong at your sample itself ({at_base.what}): gradcheck and reference report it "
                     "there; sizes judges what depends on the shape once the sample is right")
            verdict, when, hint = at_base, f"with your sample's sizes cut ({describe_cut_list(cuts)})", None
            details = ["right at your sample's sizes; wrong with the cuts alone, before any leading dim is added"]
            grounds = [AT_YOUR_RANK]
    if not verdicts.fails(context, Mismatch(when, _seen(verdict), judge.dtype), grounds, missing, LEADING_HOW):
        return
    if hint is LEADING_HINT:  # the leading dim's own failure: say what shows the op is meant to take it
        details.append(verdicts.evidence_line(grounds))
    if judge.dtype != torch.float64 and verdict.strategy != LEADING_STRATEGY:
        details.append(f"judged coarsely (central differences in {dtype_label(judge.dtype)})")
    if verdict.strategy:
        details.append(f"judged by: {verdict.strategy}")
    if hint is None and verdict.derivative is not None:
        hint = derivative_hint(verdict.derivative, has_backward=context.case.is_function)
    if verdict.raised is not None:
        context.fail_raised(verdict.raised, when, hint=hint, details=details)
    context.fail(f"{verdict.what} is wrong {when}", output=verdict.output, argument=verdict.argument,
                 worst=verdict.worst, error=verdict.error, details=details, hint=hint, evidence=verdict.evidence,
                 dtype=dtype_label(judge.dtype))


def _try_on(verdict, leading, variants):
    """Whether to try the next leading-dim variant after ``verdict``: the op refused it, or autograd refused a
    gradient while an argument shaped like the activation (a target, a mask) was left unstacked, which a later
    variant stacks (a loss whose gradient is the target times grad_output has the target's shape)."""
    if verdict.status == REFUSED:
        return True
    later = variants[variants.index(leading) + 1:]
    return (verdict.status == WRONG and verdict.raised is not None and INVALID_GRADIENT in str(verdict.raised.error)
            and any(other.slots[0] == leading.slots[0] and len(other.slots) > len(leading.slots) for other in later))


def _grounds(task):
    """What shows the op is meant to work at ``task``'s size (``engine.exploration.verdicts``)."""
    if task.kind == DECLARED:
        return [f"sizes= on the marker declares {task.size}"]
    return [AT_YOUR_RANK]


def _when(task):
    return f"when {_dim(task.axis)} (size {task.axis.size} in your sample) is {task.size}"


def _seen(verdict):
    return f"{verdict.what} is off ({verdict.worst or verdict.error})"


def _elements(sample):
    return sum(value.numel() for value in sample.values() if isinstance(value, torch.Tensor))


def _nothing_to_vary(axes):
    fixed = [f"{axis.size} ({axis.fixed})" for found in axes.values() for axis in found if axis.fixed]
    if fixed:
        return "every dimension size is kept: " + "; ".join(dict.fromkeys(fixed))
    return "no dimension to resize: every floating tensor argument has only dims of size 0 or 1"


def _dim(axis):
    place = axis.tensor_places[0]
    return f"dim {place.dim} of `{place.name}`"


def _with(axis):
    ints = [p for p in axis.places if p.dim is None]
    return f" (changed with {', '.join(p.describe() for p in ints)})" if ints else ""


def _join(sizes):
    return ", ".join(str(size) for size in sizes)


check = Sizes()
