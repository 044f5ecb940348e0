"""Shrinking a failing sample: the smallest sample found, within a time budget, that fails the same way.

A failure on a (64, 512) input is easier to fix, and to hand to whoever owns
the kernel, at (1, 3). Like Hypothesis shrinking a failing example, this
tries smaller candidates and keeps each one the check still fails on in the
same way: same check, same output and argument, same dtype, the same kind
of mismatch (the summary with its numbers left out, and what the hint
blames, not where it shows it: see ``same_failure``).

Moves, largest win first:

* sizes: every dimension of a given size shrinks at once, in every tensor
  argument (and integer arguments equal to it), so arguments that share a
  size (a matmul's inner dimension, a batch) stay consistent as the op
  requires; then single dimensions, for sizes that only coincide;
* values: rounded to one decimal (zeros kept away), and elements set to 0,
  halves first, so what is left is what the bug needs.

Every candidate is judged by running the check again on it
(``engine.running.run_check``), so a kept candidate always reproduces: a
candidate the op raises on, that passes, is skipped or fails differently is
dropped. Shrinking never turns a failure into a pass: when nothing smaller
reproduces, or the budget is spent before the first success, the original
sample stands.
"""

import dataclasses
import re
import time
import warnings
from dataclasses import dataclass

import torch

from pytest_autograd.checks.base import CheckContext
from pytest_autograd.engine.budget import TimeBudgetExceeded
from pytest_autograd.engine.case import DEFAULT_SHRINK_SECONDS, RunOptions, Sample  # noqa: F401 - re-exported
from pytest_autograd.engine.running import run_check
from pytest_autograd.results.report import Hint

# Checks whose failures are worth shrinking: they compare values on the sample, so a smaller sample shows the
# same wrong number. A check of another author opts in with ``shrinkable = True`` on its class.
SHRINKABLE = frozenset({"gradcheck", "gradgradcheck", "reference", "parity", "sizes", "precision"})
VALUES_MAX_ELEMENTS = 64  # tensors up to this size get their values simplified too
# A candidate started before the budget ran out may take this long (a first small-sample run pays one-time costs,
# such as torch's batched backward warming up), so a busy machine does not stop every candidate half-way.
CANDIDATE_FLOOR_SECONDS = 5.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def shrinkable(check, report):
    """Whether a failure of ``check`` with ``report`` can be shrunk: a mismatch on one known sample."""
    wanted = getattr(check, "shrinkable", None)
    if wanted is None:
        wanted = check.name in SHRINKABLE
    return bool(wanted) and report.sample is not None and report.worst is not None


def failure_words(report):
    """The summary's words and what the hint blames: numbers, and the names of the report's own argument and output,
    left out. A hint naming a pattern (a results.report.Hint) stands for its cause (a factor), not its wording: that
    says where the pattern shows (a column, one element, every element compared), which changes with the sample's
    size."""
    def words(text):
        if text is None:
            return None
        if report.argument:
            text = text.replace(f"`{report.argument}`", "`<argument>`")  # reports quote arguments
        if report.output:
            text = re.sub(rf"(?<![\w`]){re.escape(report.output)}(?![\w`])", "<output>", text)
        return _NUMBER.sub("#", text)

    hint = report.hint.cause if isinstance(report.hint, Hint) else report.hint
    return words(report.summary), words(hint)


def same_failure(original, candidate):
    """Whether ``candidate`` (a Report) fails as ``original`` did: the same check, dtype and kind of mismatch, and
    the original's argument (or output) among those it names as wrong.

    When several arguments are wrong, which one is worst may change with the sample; the one first reported
    must still be wrong, in the same way (the same summary and, when it is still the worst, the same hint's
    cause). A pattern confined to a part of the argument (a column, a row, one element) may show anywhere in a
    smaller sample: the column's index moves with a last-column bug, the column becomes one element once one row
    is left, or the whole argument once one column is. One shown at every element must stay at every element:
    confined to a part, it is another failure.
    """
    if (candidate.check, candidate.dtype, candidate.error is None) != \
            (original.check, original.dtype, original.error is None):
        return False
    if candidate.about(original.argument, original.output) is None:
        return False
    summary, hint = failure_words(original)
    got_summary, got_hint = failure_words(candidate)
    still_first = candidate.argument == original.argument and \
        (original.argument is not None or candidate.output == original.output)
    if still_first:
        return (summary, hint) == (got_summary, got_hint) and not _confined_to_part(original.hint, candidate.hint)
    return summary == got_summary


def _confined_to_part(original, candidate):
    """Whether a hint's pattern that showed at every element shows only in a part of the argument now."""
    return isinstance(original, Hint) and not original.confined and isinstance(candidate, Hint) and candidate.confined


@dataclass
class Shrunk:
    """A smaller sample that fails the same way, with its failure and what shrinking cost."""

    sample: Sample
    failure: object  # the CheckFailure on ``sample``
    worst: str  # the worst element there of the argument (or output) the original failure names
    locus: dict  # and where it comes from (checks/_loci.py), for a script
    original_shapes: dict
    shapes: dict
    seconds: float
    attempts: int
    complete: bool  # False: the budget ran out before every move was tried
    names: dict = dataclasses.field(default_factory=dict)  # slot -> argument name
    # sizes' failure headline there ("... when dim 0 (size 4 in your sample) is 5"): the shrunk sample may be
    # right itself, and wrong only at the size the headline names.
    headline: str = None

    def as_dict(self):
        """The report's ``shrunk`` field (see results/report.py)."""
        return {
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            "original": {name: list(shape) for name, shape in self.original_shapes.items()},
            "worst": self.worst,
            "values": values_text(self.sample, self.names),
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "complete": self.complete,
            "note": None if self.complete else "shrinking stopped at its time budget; a smaller one may exist",
            "headline": self.headline,
        }


def shrink(check, context, failure, seconds=DEFAULT_SHRINK_SECONDS):
    """A smaller sample on which ``check`` fails as ``failure`` did, or None (nothing smaller reproduces).

    ``context``: the CheckContext the failure came from (its case, device and seed are reused).
    """
    report = failure.report
    if not seconds or not shrinkable(check, report) or report.sample >= len(context.case.samples):
        return None
    search = _Search(check, context, report, seconds)
    original = context.case.samples[report.sample]
    search.best = original
    try:
        _shrink_sizes(search)
        _simplify_values(search)
    except _OutOfTime:
        pass
    if search.best is original:
        return None
    names = argument_names(context.case, original)
    worst, locus = search.best_failure.report.about(report.argument, report.output)
    headline = search.best_failure.report.summary if report.check == "sizes" else None
    return Shrunk(search.best, search.best_failure, worst, locus, shapes_of(original, names),
                  shapes_of(search.best, names), time.monotonic() - search.start, search.attempts,
                  not search.expired, names, headline)


class _OutOfTime(Exception):
    pass


class _Search:
    """The budget, the failure to reproduce, and the smallest sample found so far."""

    def __init__(self, check, context, report, seconds):
        self.check, self.context, self.report = check, context, report
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.best = None
        self.best_failure = None
        self.attempts = 0
        self.expired = False
        self.tried = set()

    def remaining(self):
        return self.deadline - time.monotonic()

    def reproduces(self, candidate):
        """Run the check on ``candidate`` alone; keep it as the best when it fails the same way."""
        left = self.remaining()
        if left <= 0:
            self.expired = True
            raise _OutOfTime()
        key = _fingerprint(candidate)
        if key in self.tried:
            return False
        self.tried.add(key)
        self.attempts += 1
        case = dataclasses.replace(self.context.case, samples=[candidate])
        options = self.context.case.run_options or RunOptions()
        limit = max(left, CANDIDATE_FLOOR_SECONDS)
        limit = limit if not options.seconds else min(limit, options.seconds)
        case.run_options = dataclasses.replace(options, seconds=limit, bench=None, repro_dir=None)
        attempt = CheckContext(self.context.check_name, case, self.context.device, self.context.seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = run_check(self.check, attempt, reseed=True)
        except (KeyboardInterrupt, SystemExit, TimeBudgetExceeded):
            raise
        except BaseException:  # noqa: BLE001 - skipped, a usage problem, the op raising: not the same failure
            return False
        if got is None or not same_failure(self.report, got.report):
            return False
        self.best, self.best_failure = candidate, got
        return True


# -- sizes ---------------------------------------------------------------------------------------------------


def _shrink_sizes(search):
    """Shrink sizes shared across arguments, then single dimensions, until no move reproduces."""
    while True:
        if not any(_try_size_class(search, size) for size in sorted(_sizes(search.best), reverse=True)) and \
                not _try_single_dimensions(search):
            return


def _try_size_class(search, size):
    """Every dimension of ``size`` in every argument (and equal integer arguments) shrunk together."""
    has_ints = _has_int(search.best, size)
    for new in targets(size):
        for ints in ((True, False) if has_ints else (False,)):
            if search.reproduces(_resized(search.best, size, new, ints)):
                return True
    return False


def _try_single_dimensions(search):
    """One dimension of one argument at a time, for sizes that only coincide with others'. Never down to 1 where
    another argument has that size: a length-1 dimension broadcasts, which is another code path than the failure's."""
    slots = _slots(search.best)
    for slot, value in slots:
        if not isinstance(value, torch.Tensor):
            continue
        elsewhere = {size for other, v in slots if other != slot and isinstance(v, torch.Tensor) for size in v.shape}
        for dim, size in enumerate(value.shape):
            for new in targets(size):
                if new == 1 and size in elsewhere:
                    continue
                if search.reproduces(_with(search.best, slot, _narrow(value, dim, new))):
                    return True
    return False


def targets(size):
    """Smaller sizes to try for ``size``, smallest first: 1 to 4, then powers of two, then half."""
    wanted = {1, 2, 3, 4, size // 2} | {2 ** k for k in range(3, max(size.bit_length(), 3))}
    return sorted(new for new in wanted if 1 <= new < size)


def _sizes(sample):
    return {size for _, value in _slots(sample) if isinstance(value, torch.Tensor) for size in value.shape if size > 1}


def _has_int(sample, size):
    return any(_int_like(value) == size or (isinstance(value, (tuple, list)) and size in map(_int_like, value))
               for _, value in _slots(sample))


def _int_like(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _resized(sample, size, new, ints):
    def resize(value):
        if isinstance(value, torch.Tensor):
            for dim, length in enumerate(value.shape):
                if length == size:
                    value = value.narrow(dim, 0, new)
            return value.clone()
        if ints and _int_like(value) == size:
            return new
        if ints and isinstance(value, (tuple, list)) and any(_int_like(v) == size for v in value):
            items = [new if _int_like(v) == size else v for v in value]
            return value._make(items) if hasattr(value, "_make") else type(value)(items)  # a namedtuple too
        return value

    return sample.replace(args=[resize(a) for a in sample.args], kwargs={k: resize(v) for k, v in sample.kwargs.items()})


def _narrow(value, dim, new):
    return value.narrow(dim, 0, new).clone()


# -- values --------------------------------------------------------------------------------------------------


def _simplify_values(search):
    """Round each small floating argument to one decimal, then set its elements to 0 where the bug allows."""
    for slot, value in _slots(search.best):
        if _simple_candidate(value):
            rounded = _rounded(value)
            if not torch.equal(rounded, value):
                search.reproduces(_with(search.best, slot, rounded))
    for slot, _ in _slots(search.best):
        _zero_elements(search, slot)


def _simple_candidate(value):
    return isinstance(value, torch.Tensor) and value.is_floating_point() and 0 < value.numel() <= VALUES_MAX_ELEMENTS \
        and bool(value.isfinite().all())


def _rounded(value):
    """One decimal, never 0 where the value was not (a zero is a kink for many ops)."""
    rounded = (value.to(torch.float64) * 10).round() / 10
    rounded = torch.where((rounded == 0) & (value != 0), torch.sign(value.to(torch.float64)) * 0.1, rounded)
    return rounded.to(value.dtype)


def _zero_elements(search, slot):
    """Set chunks of the argument to 0, halves first, keeping each that still reproduces."""
    value = dict(_slots(search.best))[slot]
    if not _simple_candidate(value):
        return
    if search.reproduces(_with(search.best, slot, torch.zeros_like(value))):
        return
    numel = value.numel()
    chunk = numel // 2
    while chunk >= 1:
        for start in range(0, numel, chunk):
            value = dict(_slots(search.best))[slot]
            flat = value.reshape(-1)
            if not bool((flat[start:start + chunk] != 0).any()):
                continue
            candidate = flat.clone()
            candidate[start:start + chunk] = 0
            search.reproduces(_with(search.best, slot, candidate.reshape(value.shape)))
        chunk //= 2


# -- samples -------------------------------------------------------------------------------------------------


def _slots(sample):
    return list(enumerate(sample.args)) + list(sample.kwargs.items())


def _with(sample, slot, value):
    if isinstance(slot, int):
        args = list(sample.args)
        args[slot] = value
        return sample.replace(args=args)
    return sample.replace(kwargs={**sample.kwargs, slot: value})


def _fingerprint(sample):
    parts = []
    for slot, value in _slots(sample):
        if isinstance(value, torch.Tensor):
            raw = value.detach().cpu().contiguous().reshape(-1)
            parts.append((slot, tuple(value.shape), str(value.dtype),
                          raw.view(torch.uint8).numpy().tobytes() if value.numel() <= 4096 else id(value)))
        else:
            parts.append((slot, repr(value)))
    return tuple(parts)


def argument_names(case, sample):
    """Slot -> the argument's name, as reports write it."""
    return {slot: case.arg_name(slot) for slot, _ in _slots(sample)}


def shapes_of(sample, names):
    """Name -> shape of every tensor argument."""
    return {names.get(slot, str(slot)): tuple(value.shape) for slot, value in _slots(sample)
            if isinstance(value, torch.Tensor)}


def values_text(sample, names, most=12):
    """``x = [[0.5, -1.3]], weight = 0`` when the sample is small enough to read; None otherwise."""
    tensors = [(names.get(slot, str(slot)), value) for slot, value in _slots(sample) if isinstance(value, torch.Tensor)]
    if not tensors or sum(value.numel() for _, value in tensors) > most:
        return None
    parts = []
    for name, value in tensors:
        if value.is_floating_point() and value.numel() and bool((value == 0).all()):
            parts.append(f"{name} = 0")
        else:
            parts.append(f"{name} = {_literal(value.tolist())}")
    return ", ".join(parts)


def _literal(value):
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, complex):
        return f"{value.real:.4g}{value.imag:+.4g}j"
    return repr(value)
