"""Judging an op at one input magnitude: the pieces of the extreme check.

The truth is the reference in float64 (else the op in float64) on exactly
the rounded inputs the op got. A magnitude where the truth raises or is
inf/NaN everywhere is outside the op's domain, not a failure. Elsewhere the
op's outputs and gradients must be finite where the truth is finite and fits
the dtype, and close to it: within the dtype's tolerance, or, when that is
exceeded, within an error budget measured on the spot (the reference's own
error in the dtype, how much the truth moves when the inputs move by one
rounding of the dtype: a condition estimate that also covers kinks and ties,
and how much the op's own result moves then: its rounding noise).

Past that budget a wrong value fails only against a yardstick of what the
dtype can reach at that magnitude: the reference's own error in the dtype.
Without one (no ``reference=``, as in a model scan, or one that does not run
in the dtype) it is noted (``engine.exploration.verdicts``): the op in
float64 says what the formula gives, not what the dtype can. Inf or NaN
where the truth is finite and fits the dtype fails either way.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._numerical import unravel
from pytest_autograd.checks._transforms import (
    Error,
    ReferenceRaised,
    cast_sample,
    forward_and_backward,
    paired_tensors,
    refuses_dtype,
    unsupported_dtype,
)
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.exploration import verdicts
from pytest_autograd.engine.exploration.verdicts import Mismatch
from pytest_autograd.results.compare import dtype_label, fmt, fmt_index

NOTHING = "nothing"  # _error's left_out= when every element counts
REFERENCE_K = 2.0  # the op may be this many times as wrong as the reference in the same dtype
CONDITION_K = 16.0  # ... or this many times the truth's own movement under one rounding of the inputs
NOISE_K = 16.0  # ... or this many times the op's own movement under one rounding of the inputs
YARDSTICK_HOW = ("to judge it, pass reference= (any implementation of the same maths that runs in {dtype}, torch's "
                 "own where there is one): its own {dtype} error there is the yardstick")


def tolerance(dtype):
    """The floor of the error budget (normwise: max abs error / max |truth|): sqrt(eps) of the dtype.

    Half the digits: at extreme magnitudes rounding errors grow with the
    op's conditioning, and this check looks for wrong values (a shortcut, a
    lost tail), not lost digits, which the precision check judges at the
    samples' own scale. 3.5e-4 in float32, 0.031 in float16, 0.088 in bfloat16.
    """
    return math.sqrt(torch.finfo(dtype).eps)


@dataclass
class Outside:
    """A magnitude outside the op's domain, and why."""

    reason: str


def differentiated_slots(case, sample):
    """Slots of the floating tensor arguments the checks differentiate (all but ``constants=``)."""
    return {slot for slot, value in zip(sample.slots(), sample.values())
            if isinstance(value, torch.Tensor) and value.is_floating_point() and slot not in case.constant_slots}


class Judge:
    """Runs and compares at one magnitude of one sample in one dtype."""

    def __init__(self, context, sample, dtype, slots, foreign=False):
        self.context, self.sample, self.dtype, self.slots = context, sample, dtype, slots
        self.foreign = foreign  # a dtype the samples are not in: the op may refuse it by design
        self.cotangents = None
        self.reference = context.case.reference
        self.truth_label = "the reference in float64" if self.reference is not None else "the op in float64"
        self.unscaled_runs = False
        self.cotangent_size = None
        self.truth_skipped = False  # the last magnitude ran the op only (its time says nothing of the truth's)
        self.scaled_slots = slots

    def _raises_unscaled(self):
        try:
            forward_and_backward(self.context, cast_sample(self.sample, self.dtype), self.dtype, self.cotangents)
        except OpRaised:
            return True
        return False

    def at(self, where, magnitude, values=True, only=None):
        """None when the op is right at ``magnitude``; an Outside when it cannot be judged there; else fail.

        ``values``: compare values too, not only finiteness (where products of inputs are representable).
        ``only``: the slots scaled (default: every differentiated one); the others keep the sample's values.
        """
        self.scaled_slots = self.slots if only is None else only
        scaled = cast_sample(self.sample, self.dtype, magnitude, self.scaled_slots)
        self.where, self.magnitude, self.truth_skipped = where, magnitude, False
        try:
            got, drawn = forward_and_backward(self.context, scaled, self.dtype, self.cotangents)
        except OpRaised as raised:
            if isinstance(raised, ReferenceRaised) or unsupported_dtype(raised) or \
                    (self.foreign and refuses_dtype(raised)):
                raise
            outside = self._truth_or_outside(scaled)
            if isinstance(outside, Outside):
                return Outside(f"{outside.reason}, and the op raises too")
            if self._raises_unscaled():  # not the magnitude's doing: say so, as every other check does
                self.context.fail_raised(raised, situation=f"on the sample as given, in {dtype_label(self.dtype)}, "
                                         "at every magnitude")
            self.context.fail_raised(raised, situation=f"for inputs scaled to max |x| = {fmt(magnitude)}, where "
                                     f"{self.truth_label} runs", details=[self._scaled_line()])
        self.cotangents = self.cotangents or drawn  # drawn at the first magnitude, the same for all
        self.truth_skipped = not values and _all_finite(got)
        if self.truth_skipped:
            return None  # only finiteness is judged here, and the op gave nothing else: no truth needed
        truth = self._truth_or_outside(scaled)
        if isinstance(truth, Outside):
            return truth
        pairs = [_Compared(pair, self.dtype) for pair in paired_tensors(truth, got)]
        if pairs and not any(p.everywhere or bool(p.representable.any()) for p in pairs):
            return Outside(f"{self.truth_label} is inf/NaN, or beyond {dtype_label(self.dtype)}'s range, at every "
                           "element")
        if self._check_finite(scaled, pairs) and values:
            self._check_values(scaled, truth, got, pairs)
        return None

    def _truth_or_outside(self, scaled):
        try:
            truth, _ = forward_and_backward(self.context, scaled, torch.float64, self.cotangents, fn=self.reference)
        except OpRaised as raised:
            self._raises_on_the_sample_itself()
            return Outside(f"{self.truth_label} raises {type(raised.error).__name__} ({_short(raised.error)})")
        return truth

    def _raises_on_the_sample_itself(self):
        """A truth that raises on the unscaled sample too is broken, not out of its domain: report that."""
        if self.unscaled_runs:
            return
        try:
            forward_and_backward(self.context, self.sample, torch.float64, self.cotangents, fn=self.reference)
        except ReferenceRaised as raised:
            self.context.fail_reference_raised(raised)
        self.unscaled_runs = True  # an op that raises there propagates: the op's failure

    def _scaled_line(self):
        if self.scaled_slots != self.slots:
            names = ", ".join(f"`{self.context.case.arg_name(slot)}`" for slot in self.scaled_slots)
            return (f"magnitude {self.where}: {names} scaled so its largest |element| is {fmt(self.magnitude)}, the "
                    "other inputs as given (one input at a time here: products of two tiny inputs are subnormal, "
                    "whose arithmetic runs up to 150 times slower)")
        return (f"magnitude {self.where}: every differentiated input scaled so its largest |element| is "
                f"{fmt(self.magnitude)} (constants= arguments keep their values)")

    # -- finiteness ------------------------------------------------------------------------------------------

    def _at(self):
        return f"at max |x| = {fmt(self.magnitude)} in {dtype_label(self.dtype)}"

    def _check_finite(self, scaled, pairs):
        """Fail for inf or NaN where the truth is finite and fits the dtype; False when such a failure was noted
        instead (numbers that cannot be trusted), True otherwise."""
        same_dtype_reference = None
        overflowed_output = False
        for compared in pairs:
            if compared.everywhere:  # every element finite and representable: nothing to blame
                continue
            pair, e, g = compared.pair, compared.expected, compared.got
            if "output" in pair.fields:
                overflowed_output |= not bool((compared.representable | compared.got_finite).all())
            elif overflowed_output:
                # An output the dtype cannot hold is inf; gradients computed from it (exp's saved output)
                # cannot be demanded finite.
                continue
            bad = compared.representable & ~compared.got_finite
            if bool(bad.any()) and self.reference is not None:
                # Overflow the reference in the same dtype shares is no worse than the reference.
                if same_dtype_reference is None:
                    same_dtype_reference = self._reference_in_dtype(scaled)
                low = same_dtype_reference.get(pair.label)
                if low is not None:
                    bad &= _as64(low).isfinite()
            if not bool(bad.any()):
                continue
            index = tuple(int(i) for i in bad.nonzero()[0])
            value = float(g[index])
            name = dtype_label(self.dtype)
            seen = f"{pair.what} is {fmt(value)} where {self.truth_label} gives {fmt(float(e[index]))}"
            if not verdicts.fails(self.context, Mismatch(self._at(), seen, self.dtype),
                                  [f"{self.truth_label} is finite there, within {name}'s range"]):
                return False
            self.context.fail(
                f"{pair.what} is {'NaN' if math.isnan(value) else 'inf'} in {dtype_label(self.dtype)} for inputs "
                f"scaled to max |x| = {fmt(self.magnitude)}, where {self.truth_label} is finite",
                dtype=dtype_label(self.dtype),
                worst=f"{pair.label}{fmt_index(index)}: {self.truth_label} gives {fmt(float(e[index]))}, "
                      f"the op {fmt(value)}",
                error=f"{int(bad.sum())} of {bad.numel()} elements are inf/NaN where {self.truth_label} is finite",
                details=[self._scaled_line()], hint=_finite_hint(self.where, "argument" in pair.fields, self.dtype),
                **pair.fields)
        return True

    def _reference_in_dtype(self, scaled):
        """Label -> the reference's tensor in the op's dtype (an empty dict when it raises there)."""
        try:
            low, _ = forward_and_backward(self.context, scaled, self.dtype, self.cotangents, fn=self.reference)
        except OpRaised:
            return {}
        return {pair.label: pair.got for pair in paired_tensors(low, low)}

    # -- values ----------------------------------------------------------------------------------------------

    def _check_values(self, scaled, truth, got, pairs):
        tol = tolerance(self.dtype)
        self.scales = self._natural_scales(truth)
        errors = [(c.pair, c.error(self.scales.get(c.pair.label, 0.0), locate_above=tol)) for c in pairs]
        suspects = [(pair, error) for pair, error in errors if error.value > tol]
        if not suspects:
            return
        budgets, yardstick = self._budgets(scaled, truth, [pair.label for pair, _ in suspects], tol)
        over = [(pair, error) for pair, error in suspects if error.value > budgets[pair.label]]
        if over:  # the op's own rounding noise: a cancellation any implementation of its algorithm has
            noise = self._own_noise(scaled, truth, got, {pair.label for pair, _ in over})
            budgets.update({label: max(budgets[label], NOISE_K * movement) for label, movement in noise.items()})
        over = [(pair, error, budgets[pair.label]) for pair, error in over if error.value > budgets[pair.label]]
        if not over:
            return
        over.sort(key=lambda item: -item[1].value / item[2])
        pair, error, budget = over[0]
        name = dtype_label(self.dtype)
        seen = (f"{pair.what} is off from {self.truth_label} by {fmt(error.value)}, over its budget {fmt(budget)} "
                f"({pair.label}{fmt_index(error.index)}: {fmt(error.expected)} against {fmt(error.got)})")
        evidence = [yardstick] if yardstick else []
        if not verdicts.fails(self.context, Mismatch(self._at(), seen, self.dtype), evidence,
                              self._no_yardstick(), YARDSTICK_HOW.format(dtype=name), draws_differ=True):
            return
        self.context.fail(
            f"{pair.what} in {name} is off from {self.truth_label} by {fmt(error.value)} for inputs scaled to "
            f"max |x| = {fmt(self.magnitude)}, more than its error budget {fmt(budget)}",
            dtype=name,
            worst=f"{pair.label}{fmt_index(error.index)}: {self.truth_label} gives {fmt(error.expected)}, "
                  f"the op {fmt(error.got)}",
            error=(f"error {fmt(error.value)} (max abs error / max |float64 value|, over finite elements that fit "
                   f"{name}) > budget {fmt(budget)}: the {name} tolerance sqrt(eps) = "
                   f"{fmt(tol)}, {fmt(REFERENCE_K)} x the reference's own {name} error, or {fmt(CONDITION_K)} x "
                   f"how far the truth moves, or {fmt(NOISE_K)} x how far the op's own result moves, when the inputs "
                   f"move by one {name} rounding, whichever is largest"),
            details=[self._scaled_line()] + [f"also {p.what}: error {fmt(e.value)} > {fmt(b)}" for p, e, b in over[1:]]
            + [verdicts.evidence_line(evidence)],
            hint=_value_hint("argument" in pair.fields, self._right_unscaled(pair.label), error), **pair.fields)

    def _right_unscaled(self, label):
        """Whether ``label`` (an output or gradient) is right on the sample as it is, not rescaled: True, False, or
        None when that cannot be judged. A hint about large |x| needs True."""
        try:
            got, _ = forward_and_backward(self.context, self.sample, self.dtype, self.cotangents)
            truth, _ = forward_and_backward(self.context, self.sample, torch.float64, self.cotangents,
                                            fn=self.reference)
        except OpRaised:
            return None
        for pair in paired_tensors(truth, got):
            if pair.label == label:
                return _error(pair.expected, pair.got, self.dtype, locate_above=math.inf).value <= tolerance(self.dtype)
        return None

    def _no_yardstick(self):
        name = dtype_label(self.dtype)
        if self.reference is None:
            return (f"without reference= the truth is the op itself in float64, which says what its formula gives, not "
                    f"what {name} can reach at this magnitude: there is no yardstick")
        return f"reference= does not run in {name}, so nothing measures what {name} can reach at this magnitude"

    def _own_noise(self, scaled, truth, got, labels):
        """Label -> how far the op's own result in the dtype moves when each differentiated input moves by about one
        rounding of the dtype, random signs both ways, the cotangents kept; normwise on the scale its error is
        measured on (the truth's, or the tensor's natural size).

        An algorithm that cancels (FlashAttention's backward: ``dP - rowsum(dO * O)`` where a row's softmax
        saturates) loses digits in the dtype however it is written; such an error moves about as much as it is
        large when the inputs move by one rounding. A shortcut or a wrong branch is systematic: it stays.
        """
        fits = torch.finfo(self.dtype).max
        scales = {pair.label: max(float(_as64(pair.expected).abs().nan_to_num(0.0, 0.0, 0.0).clamp(max=fits).max()),
                                  self.scales.get(pair.label, 0.0))
                  for pair in paired_tensors(truth, truth) if pair.label in labels and pair.expected.numel()}
        noise = {}
        for sign in (1.0, -1.0):
            moved = cast_sample(nudged(scaled, self.slots, self.dtype, sign, self.context.seed, zeros_too=False),
                                self.dtype)
            try:
                again, _ = forward_and_backward(self.context, moved, self.dtype, self.cotangents)
            except OpRaised:  # the nudge left the domain: no estimate from this side
                continue
            for pair in paired_tensors(got, again):
                if scales.get(pair.label, 0.0) > 0 and pair.expected.shape == pair.got.shape:
                    moves = (_as64(pair.got) - _as64(pair.expected)).abs().nan_to_num(0.0, 0.0, 0.0)
                    noise[pair.label] = max(noise.get(pair.label, 0.0), float(moves.max()) / scales[pair.label])
        return noise

    def _budgets(self, scaled, truth, labels, tol):
        """(label -> error budget: the tolerance, the reference's own error, or the condition estimate; the yardstick
        of what the dtype can reach there: words naming the reference's run in the dtype, None without one)."""
        budgets = {label: tol for label in labels}
        reference_low = self._reference_in_dtype(scaled) if self.reference is not None else {}
        name = dtype_label(self.dtype)
        yardstick = f"reference= runs in {name} there, and its own error measures what {name} can reach" \
            if reference_low else None
        truths = {pair.label: pair.expected for pair in paired_tensors(truth, truth)}
        for label, low in reference_low.items():
            if label in budgets:
                error = self._error(label, truths[label], low).value
                budgets[label] = max(budgets[label], REFERENCE_K * error + tol)
        for sign in (1.0, -1.0):
            try:
                moved, _ = forward_and_backward(self.context, self._nudged(scaled, sign), torch.float64,
                                                self._nudged_cotangents(sign), fn=self.reference)
            except OpRaised:  # the nudge left the domain: no estimate from this side
                continue
            for pair in paired_tensors(truth, moved):
                if pair.label in budgets:
                    movement = self._error(pair, pair.expected, pair.got, rounded=False).value
                    budgets[pair.label] = max(budgets[pair.label], CONDITION_K * movement)
        return budgets, yardstick

    def _natural_scales(self, truth):
        """Label -> the size a value of that tensor has at this magnitude when it is not small by cancellation.

        An output's is its own largest |value|. A gradient's is |cotangent| x
        |output| / |input|: saturating ops have gradients far below it (tanh's
        is 1e-13 at |x| = 30), and an error there that is small against it
        (the float32 1 - y*y of a y that rounds to 1) is harmless, while a
        shortcut to 0 where the derivative is ~1 is not.
        """
        fits = torch.finfo(self.dtype).max
        output_size = 0.0
        for output in truth.outputs:
            if output.is_floating_point() and output.numel():
                output = output.detach()
                low, high = (float(v) for v in torch.aminmax(output))  # one reduction, no copy
                peak = max(high, -low)
                if not peak <= fits:  # NaN, inf or beyond the dtype somewhere: the largest that fits
                    size = output.abs()
                    peak = float(size.masked_fill_(~(size <= fits), 0.0).max())
                output_size = max(output_size, peak)
        if self.cotangent_size is None:
            self.cotangent_size = max((float(c.abs().max()) for c in self.cotangents if c is not None and c.numel()),
                                      default=0.0)
        gradient_size = self.cotangent_size * output_size / self.magnitude
        return {f"grad {name}": gradient_size for name in truth.names}

    def _error(self, pair_or_label, expected, got, rounded=True):
        """The error's value only (a budget's measure: no element is named)."""
        label = getattr(pair_or_label, "label", pair_or_label)
        return _error(expected, got, self.dtype, rounded, self.scales.get(label, 0.0), locate_above=math.inf)

    def _nudged_cotangents(self, sign):
        """The cotangents moved by one rounding too: backward's cancellations depend on them."""
        eps = torch.finfo(self.dtype).eps
        generator = torch.Generator().manual_seed(self.context.seed + 1)
        moved = []
        for c in self.cotangents:
            if c is None:
                moved.append(None)
                continue
            signs = torch.randint(0, 2, c.shape, generator=generator, dtype=torch.float64) * 2 - 1
            moved.append(c + sign * signs * eps * c.abs())
        return moved

    def _nudged(self, scaled, sign):
        """The scaled sample with each differentiated element moved by about one rounding of the dtype (see
        :func:`nudged`); zeros move too."""
        return nudged(scaled, self.slots, self.dtype, sign, self.context.seed)


def nudged(sample, slots, dtype, sign, seed, zeros_too=True):
    """``sample`` with each element of its tensors in ``slots`` moved by about one rounding of ``dtype``, as float64.

    Random signs drawn from ``seed`` (antithetic: ``sign`` flips them all), so that ties are broken both ways and
    kinks are crossed from both sides. ``zeros_too``: an element's move has a floor of eps x the tensor's largest
    |element|, so zeros move as well.
    """
    eps = torch.finfo(dtype).eps
    generator = torch.Generator().manual_seed(seed)

    def nudge(slot, value):
        if slot not in slots or not isinstance(value, torch.Tensor):
            return value
        value = value.to(torch.float64)
        step = value.abs()
        if zeros_too:
            step += eps * (float(value.abs().max()) if value.numel() else 0.0)
        signs = torch.randint(0, 2, value.shape, generator=generator, dtype=torch.float64) * 2 - 1
        return value + sign * signs * eps * step

    return sample.map(nudge)


class _Compared:
    """One output or gradient of the op against the truth, as float64, with the masks both checks need.

    The masks are made only when some element is special: usually every
    value fits and is finite (``everywhere``), which two reductions tell.
    """

    def __init__(self, pair, dtype):
        self.pair, self.dtype = pair, dtype
        self.expected, self.got = _as64(pair.expected), _on_cpu(pair.got)
        self.everywhere, self.peak = _holds_everything(self.expected, self.got, torch.finfo(dtype))
        self._representable = self._got_finite = None

    @property
    def representable(self):
        """Finite and within the dtype's range (NaN and inf compare False)."""
        if self._representable is None:
            self._representable = self.expected.abs() <= torch.finfo(self.dtype).max
        return self._representable

    @property
    def got_finite(self):
        if self._got_finite is None:
            self._got_finite = self.got.isfinite()
        return self._got_finite

    def error(self, natural_scale, locate_above=-1.0):
        if self.expected.shape != self.got.shape:
            return Error(0.0)
        left_out = NOTHING if self.everywhere else ~(self.representable & self.got_finite)
        return _error(self.expected, self.got, self.dtype, True, natural_scale, left_out=left_out, peak=self.peak,
                      locate_above=locate_above)


def _all_finite(run):
    return all(bool(t.isfinite().all()) for t in list(run.outputs) + list(run.grads) if t.is_floating_point())


def _as64(tensor):
    return tensor.detach().to("cpu", torch.float64)


def _on_cpu(tensor):
    """``tensor`` on the CPU, in its own real floating dtype: arithmetic with a float64 tensor promotes each
    element as it goes, without the float64 copy (8 bytes an element, freshly faulted in) ``_as64`` makes."""
    tensor = tensor.detach().to("cpu")
    return tensor if tensor.is_floating_point() else tensor.to(torch.float64)


def _error(expected, got, dtype, rounded=True, natural_scale=0.0, left_out=None, peak=None, locate_above=-1.0):
    """Normwise error over the elements the dtype can hold: finite in both, within its range.

    max |got - expected| / max(max |expected|, ``natural_scale``). Differences
    below the dtype's smallest normal number are ignored when ``rounded``
    (what underflows in the dtype cannot be told apart from 0). ``left_out``:
    a mask of the elements outside that (None: computed here; ``NOTHING``:
    none, and ``peak`` is max |expected|). The worst element is located only
    for an error above ``locate_above`` (one more pass; a report names it).
    """
    e, g = _as64(expected), _on_cpu(got)
    if e.shape != g.shape or not e.numel():
        return Error(0.0)
    info = torch.finfo(dtype)
    if left_out is None:
        everywhere, peak = _holds_everything(e, g, info)
        left_out = NOTHING if everywhere else ~((e.abs() <= info.max) & g.isfinite())
    if left_out is NOTHING:
        left_out = None
    diff = g - e
    if left_out is not None:
        diff.masked_fill_(left_out, 0.0)
    low, high = (float(v) for v in torch.aminmax(diff))  # max |diff| without an abs pass
    worst = max(high, -low)
    if rounded:  # the largest difference less the smallest normal, as every difference less it would give
        worst = max(worst - info.tiny, 0.0)
    if worst == 0.0:
        return Error(0.0)
    if left_out is not None:
        peak = float(e.abs().masked_fill_(left_out, 0.0).max())
    scale = max(peak, natural_scale)
    value = worst / scale if scale > 0 else math.inf
    if value <= locate_above:
        return Error(value)
    flat = int(diff.abs_().reshape(-1).argmax())
    return Error(value, unravel(flat, e.shape), float(e.reshape(-1)[flat]), float(g.reshape(-1)[flat]))


def _holds_everything(expected, got, info):
    """(whether every expected value fits the dtype and every got value is finite, max |expected|), by reductions
    that allocate nothing: the least and the largest value are NaN when any is, and infinite when any is (one
    pass in the tensor's own dtype, a tenth of what a float64 sum of float32 values costs)."""
    if not expected.numel():
        return True, 0.0
    low, high = (float(v) for v in torch.aminmax(expected))  # one pass; NaN when any is NaN
    peak = max(high, -low) if high == high and low == low else math.nan
    finite = not got.numel() or all(math.isfinite(float(v)) for v in torch.aminmax(got))
    return peak <= info.max and finite, peak


def _short(error):
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _finite_hint(where, in_gradient, dtype):
    if where.startswith("tiny"):
        hint = ("an intermediate underflows to 0 and is then divided by or logged (a norm or variance of tiny "
                "inputs): add an eps, or rescale before squaring")
    else:
        hint = (f"an intermediate overflows {dtype_label(dtype)} (max {fmt(torch.finfo(dtype).max)}): exp of a "
                "large input or a big product; subtract the max before exp (as softmax and logsumexp do) "
                "or rescale")
    if in_gradient:
        hint += "; the outputs are finite, so look at backward (a saved inf, or 1/x of an underflowed value)"
    return hint


def _value_hint(in_gradient, right_unscaled, error):
    """What a wrong value at a large magnitude points to, as far as the evidence goes: a large-|x| branch only when
    the op is right on the unscaled sample, a shortcut to 0 only when the op gives 0 there."""
    what = "backward" if in_gradient else "the output"
    if right_unscaled is False:
        return (f"{what} is wrong on the samples as they are too, not only at large |x|: the formula itself is off, "
                "not a large-|x| branch; gradcheck and reference report it on the unscaled samples")
    unscaled = ", and right on the samples as they are" if right_unscaled else ""
    if in_gradient and error.got == 0 and error.expected != 0:
        return (f"backward is wrong at large |x| although it stays finite: a shortcut that returns 0 past a threshold "
                f"(the op's gradient is 0 where the derivative is not){unscaled}; compare backward's large-|x| branch "
                "with the derivative of the forward's")
    if in_gradient:
        return (f"backward is wrong at large |x| although it stays finite{unscaled}: a saturation branch whose "
                "derivative is not the forward's, or a threshold that switches in too early; compare backward's "
                "large-|x| branch with the derivative of the forward's")
    return (f"the output is wrong at this magnitude although it is finite{unscaled}: an asymptotic formula or a "
            "threshold that switches in too early, or a clamp of the input; compare the large-|x| branch with the "
            "exact formula")
