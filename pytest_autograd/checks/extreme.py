"""extreme: right answers, not only finite ones, at moderate, large and tiny input magnitudes.

Random samples of unit size never reach the range where a naive softmax's
``exp`` overflows, a norm's squares underflow, or a saturating op's backward
takes a shortcut. Every differentiated input (never a ``constants=``
argument, never an integer tensor) is scaled to a few magnitudes per dtype
(at the tiny one, an input at a time): 6 and 20 (where
tanh/sigmoid/softplus-like ops switch to their tails), just past where
``exp`` overflows, ``max ** 0.25 / 2`` (products of up to four inputs stay
in range) and a value whose square underflows to zero. The op's
outputs and gradients in the dtype are judged against the reference in
float64 (without one: the op in float64) on the same rounded inputs; see
``_edges``. Magnitudes where that truth raises or is inf/NaN everywhere are
outside the op's domain and skipped with a note; a magnitude that runs far
longer than the smallest one is stopped, and the larger ones with it.

A magnitude a sample already reaches (every differentiated input's largest
|element| within a factor ``REACHED`` of it, in the sample's own dtype) is
not run for that sample: rescaling would hand the op nearly the values it
was given, which reference and precision judge at their own scale, against
tighter tolerances. A large random sample reaches 6 by itself (the largest
of a million normal draws is about 5), and that run would cost as much as
the sample's own.

On a sample of over 16k elements the magnitudes are judged on its first
rows, each row whole (``_fewer_rows``): a magnitude acts on every row alike,
and each row would cost as much here as in gradcheck.
"""

import math
import time

import torch

from pytest_autograd.checks._edges import Judge, Outside, differentiated_slots
from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._transforms import (
    DtypeRefusals,
    ReferenceRaised,
    cast_sample,
    check_dtypes,
    samples_dtypes,
)
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.budget import call_with_limit
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.exploration import CRASHED, Variant, attempt
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.results.compare import dtype_label, fmt

TINY = "tiny: squares underflow to 0"
MODERATE = {
    "moderate: saturating tails begin": 6.0,
    "moderate: tanh and sigmoid saturate": 20.0,
}
SCALED = "the plugin scaled your values to that magnitude, which the op need not accept"
REACHED = 2.0  # a sample whose inputs' largest |element| lies within this factor of a magnitude is already there
MAGNITUDE_SECONDS = 2.0  # each magnitude may take at least this long ...
MAGNITUDE_SLOWDOWN = 50.0  # ... or this many times the first (smallest) magnitude took


def magnitudes(dtype):
    """(name, largest |input|) pairs for ``dtype``, smallest first."""
    info = torch.finfo(dtype)
    found = {
        TINY: 0.5 * math.sqrt(info.tiny * info.eps),
        **MODERATE,
        "large: exp overflows": 2 * math.log(info.max),
        "huge: products of four inputs still fit": info.max ** 0.25 / 2,
    }
    return sorted(found.items(), key=lambda item: item[1])


class Extreme(Check):
    name = "extreme"
    explores = True  # builds inputs the user did not give: judged by engine.exploration, run in the sandbox
    random_draws_differ = "a run in the dtype and the float64 truth draw different numbers from one seed"
    description = ("outputs and gradients finite and right (against the reference, or the op in float64) at "
                   "moderate, large and tiny input magnitudes")
    options = {"dtypes": None}

    def applies(self, case, device):
        if not any(differentiated_slots(case, sample) for sample in case.samples):
            if any(isinstance(v, torch.Tensor) and v.is_floating_point()
                   for s in case.samples for v in list(s.args) + list(s.kwargs.values())):
                return "every floating-point argument is a constants= argument, and constants are never rescaled"
            return "no floating-point tensor argument to scale"
        return None

    def run(self, context):
        case = context.case
        dtypes, explicit = check_dtypes(case, context.device)
        if not dtypes:
            skip("dtypes= on the marker declares no dtype below float64 to check")
        refused = case.reference is None and next(filter(None, (float64_plan(context, s) for s in case.samples)), None)
        if refused:
            skip(f"{refused.reason}: without reference= there is no float64 truth for extreme inputs")
        refusals, notes, judged = DtypeRefusals(self.name, dtypes, explicit, case), {}, 0
        for dtype in dtypes:
            try:
                judged += _check_dtype(context, dtype, notes)
            except OpRaised as raised:
                if not refusals.refused(raised, dtype):
                    if isinstance(raised, ReferenceRaised):
                        context.fail_reference_raised(raised)
                    raise
        context.sample_index = None
        refusals.finish(context)
        lines = [f"{reason} at max |x| = {', '.join(dict.fromkeys(values))}" for reason, values in notes.items()]
        if not judged and lines:
            skip("no magnitude could be judged: " + "; ".join(lines))
        for line in lines:
            context.note(f"extreme: {line}")


def _check_dtype(context, dtype, notes):
    """Judge every sample at every magnitude in ``dtype``; return how many (sample, magnitude) were judged.

    Each magnitude may take ``MAGNITUDE_SLOWDOWN`` times as long as the first
    (smallest) one took, at least ``MAGNITUDE_SECONDS``; a magnitude past that
    is stopped, and the larger ones are not run.
    """
    judged, stopped_at = 0, math.inf
    seconds_left = context.case.run_options.seconds
    cap = max(MAGNITUDE_SECONDS, seconds_left / (len(magnitudes(dtype)) + 1)) if seconds_left else None
    for index, sample in context.samples():
        slots = differentiated_slots(context.case, sample)
        if not slots:
            continue
        foreign = dtype not in samples_dtypes(context.case)  # a dtype the op may refuse by design
        sample = judged_sample(context, index, sample)
        judge = Judge(context, cast_sample(sample, dtype, slots=slots), dtype, slots, foreign)
        peaks = None if foreign else _peaks(sample, slots)
        limit = cap
        for where, magnitude in magnitudes(dtype):
            label = fmt(magnitude)
            if peaks and all(magnitude / REACHED <= peak <= magnitude * REACHED for peak in peaks):
                notes.setdefault(f"not run where the sample is already there (its inputs' largest |element| within "
                                 f"{fmt(REACHED)}x of it: judged at its own scale by reference and precision)",
                                 []).append(label)
                continue
            if magnitude >= stopped_at:
                notes.setdefault("not run (a smaller magnitude was stopped for time)", []).append(label)
                continue
            start = time.perf_counter()
            if where == TINY:  # products of inputs underflow by design: only finiteness is judged, an input at a time
                run = lambda: _tiny(judge, magnitude, _in_call_order(sample, slots))  # noqa: E731
            else:
                run = lambda: judge.at(where, magnitude)  # noqa: E731
            variant = Variant(context.check_name, f"for inputs scaled to max |x| = {label} in {dtype_label(dtype)}",
                              missing=SCALED, how="a sample at that magnitude judges it")
            finished = call_with_limit(limit, lambda: attempt(context, variant, run))  # noqa: B023
            if finished.value is CRASHED:  # noted with the crash itself; counted so that all crashes skip
                notes.setdefault("the op crashed the process", []).append(label)
                continue
            if finished.expired is not None:
                stopped_at = magnitude
                notes.setdefault(f"stopped after {fmt(limit)} s (the op is far slower there than at smaller "
                                 "magnitudes, e.g. a solver that does not converge)", []).append(label)
                continue
            if limit is cap and not judge.truth_skipped:  # the first magnitude timed with its truth sets the pace
                limit = max(MAGNITUDE_SECONDS, MAGNITUDE_SLOWDOWN * (time.perf_counter() - start))
                limit = min(limit, cap) if cap else limit
            if isinstance(finished.value, Outside):
                notes.setdefault(f"outside the op's domain ({finished.value.reason})", []).append(label)
            else:
                judged += 1
    return judged


def _tiny(judge, magnitude, slots):
    """The tiny magnitude, each differentiated input scaled alone when there are several: a square of one input
    underflows as it does with every input tiny, but a product of two tiny inputs is subnormal, and a matrix
    product of two tiny matrices runs 150 times slower than at unit scale (0.4 s for 512 x 512 on one core).
    The first Outside, or None."""
    if len(slots) == 1:
        return judge.at(TINY, magnitude, values=False)
    found = [judge.at(TINY, magnitude, values=False, only={slot}) for slot in slots]
    return next((outside for outside in found if outside is not None), None)


def _in_call_order(sample, slots):
    """``slots`` in the order of the call: positions, then keywords as the sample gives them."""
    return [slot for slot in sample.slots() if slot in slots]


def _peaks(sample, slots):
    """The largest |element| of each differentiated input of ``sample`` (NaN where one holds NaN); empty when one
    has no element."""
    found = []
    for slot, value in zip(sample.slots(), sample.values()):
        if slot in slots:
            if not value.numel():
                return []
            low, high = (float(v) for v in torch.aminmax(value.detach()))
            found.append(max(high, -low) if high == high and low == low else math.nan)
    return found


check = Extreme()
