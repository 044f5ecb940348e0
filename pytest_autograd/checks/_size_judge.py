"""Judging an op at one size variant, in the dtype strategy that applies to it.

* float64, with ``reference=``: outputs and gradients (same cotangent) against
  the reference's, within float64's tolerance;
* float64, without one: the derivative engine (``find_derivative_error``),
  whole-input probes above a few dozen elements, so a large variant costs a
  handful of evaluations;
* an op that cannot run in float64 (``_float64_support``), with ``reference=``:
  its outputs and gradients in its dtype against the reference's in float64 on
  the same rounded inputs, within a budget from the reference's own error in
  that dtype and the op's own error at the sample, grown with the size (a
  longer reduction rounds more; a lost tail is off by far more);
* without one: central differences in its dtype with a measured tolerance.

A forward that raises at a variant puts it outside the op's contract: noted,
not judged. So does a backward that raises (unless autograd refuses the
gradient's shape: that is the op's bug), and, without a reference to tell a
domain from a bug, outputs that are not finite.
"""

import math
import time
from dataclasses import dataclass, field

import torch

from pytest_autograd.checks._agreement import agree
from pytest_autograd.checks._derivatives import (
    KinkNotes,
    find_derivative_error,
    marker_tolerances,
)
from pytest_autograd.checks._measured_differences import find_low_precision_error
from pytest_autograd.checks._transforms import (
    ReferenceRaised,
    cast_sample,
    forward_and_backward,
    normwise_error,
    paired_tensors,
)
from pytest_autograd.engine.execution import (
    OpRaised,
    UsageProblem,
    declared_nondifferentiable,
    grads_of,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.exploration.isolation import seconds_in_trials
from pytest_autograd.results.compare import compare_tensors, dtype_label, fmt

RIGHT, WRONG, REFUSED, OUTSIDE, UNRESOLVED = "right", "wrong", "refused", "outside", "unresolved"
NOTED = "noted"  # wrong, but without evidence that the op is meant to work there: noted (engine.exploration.verdicts)
EXHAUSTIVE_ELEMENTS = 8  # the full Jacobian only for variants this small (2 evaluations an element); probes above
LOW_PRECISION_K = 8.0  # the op may be this many times as far from float64 as the reference, or as itself at the sample
NOISE_K = 8.0  # ... or this many times as far as its own result moves when its inputs move by one rounding
INVALID_GRADIENT = "returned an invalid gradient"  # autograd refusing a gradient of the wrong shape: the op's bug
COMPILE_SECONDS = 5.0  # a forward timed on a GPU may take this long at a new shape: its kernels may compile first
STRATEGY_REFERENCE = "outputs and gradients in float64 against the reference's (same cotangent)"


@dataclass
class Verdict:
    """What one variant showed: right, wrong (with the worst element), refused, outside, unresolved (central
    differences in a low dtype could not judge it) or noted (wrong without evidence), with why."""

    status: str
    what: str = None  # "gradient w.r.t. `x`", "output 1"
    argument: str = None
    output: str = None
    worst: str = None
    error: str = None
    strategy: str = None
    reason: str = None  # refused or outside: why
    raised: OpRaised = None
    derivative: object = None  # the DerivativeError behind a wrong gradient (for the derivative hints)
    evidence: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    grounds: list = field(default_factory=list)  # what shows the op is meant to work at the variant (verdicts)


class Judge:
    """Judges one sample's variants in one strategy; remembers what it needs across them."""

    def __init__(self, context, sample, plan):
        self.context, self.sample, self.plan = context, sample, plan
        self.dtype = torch.float64 if plan is None else plan.dtype
        self.reference = context.case.reference
        self.sample_errors = None  # low precision with a reference: the op's own error at the sample, per label
        self.reference_finite_at_sample = None

    @property
    def strategy(self):
        """How a variant is judged below float64 (the float64 strategies name themselves per verdict)."""
        if self.plan is None:
            return STRATEGY_REFERENCE if self.reference is not None else "the derivative engine in float64"
        if self.reference is not None:
            return (f"outputs and gradients in {dtype_label(self.dtype)} against the reference's in float64 on the "
                    "same rounded inputs")
        return self.plan.strategy(False)

    @property
    def evaluations(self):
        """About how many forwards (and backwards) judging one variant takes in this strategy."""
        if self.reference is not None:  # a forward and a backward of the op and of the reference (two in low precision)
            return 6 if self.plan is None else 9
        if self.plan is None:
            return 16
        leaves = sum(1 for value in list(self.sample.args) + list(self.sample.kwargs.values())
                     if isinstance(value, torch.Tensor) and value.is_floating_point())
        return 48 * max(1, leaves)

    def forward_seconds(self, variant, limit, enough=0.0):
        """Seconds one forward on ``variant`` takes in this strategy's dtype (the faster of two when quick, the first
        when it takes ``enough`` or less already); None when stopped at ``limit`` (0 when it raises: the judging says
        so).

        On a GPU the first call at a new shape may compile kernels for it (Triton specializes on sizes, a
        torch.compile'd op recompiles): that call may take up to ``COMPILE_SECONDS``, and when it took over
        ``limit`` a second call, stopped at ``limit``, says what a forward costs.
        """
        from pytest_autograd.engine.budget import call_with_limit

        def forward():
            start, trials = time.perf_counter(), seconds_in_trials()
            try:
                self.context.run_op(self.context.prepare(variant, dtype=self.dtype))
            except (OpRaised, UsageProblem):
                return 0.0
            if self.context.device.startswith("cuda"):
                torch.cuda.synchronize(self.context.device)  # kernels run asynchronously: wait for them
            return max(time.perf_counter() - start - (seconds_in_trials() - trials), 1e-9)  # the op's time alone

        try:
            first_limit = max(limit, COMPILE_SECONDS) if first_call_may_compile(self.context.device) else limit
            first = call_with_limit(first_limit, forward)
            if first.expired is not None:
                return None
            if first.value == 0.0 or first.value <= enough or (first.value > limit / 2 and first_limit == limit):
                return first.value
            again = call_with_limit(limit, forward)  # the first call at a shape may pay for allocations or a compile
            return None if again.expired is not None else min(first.value, again.value)
        finally:
            self.context.dtype = self.dtype

    def at(self, variant, size_ratio=1.0):
        """The Verdict of the op on ``variant`` (a Sample), whose changed size is ``size_ratio`` x the sample's."""
        try:
            if self.plan is None:
                return self._float64(variant)
            return self._low_precision(variant, size_ratio)
        except (OpRaised, UsageProblem) as raised:  # a UsageProblem: e.g. no tensor output at this size
            return refusal(raised)
        finally:
            self.context.dtype = self.dtype

    # float64 ---------------------------------------------------------------------------------------------

    def _float64(self, variant):
        context = self.context
        prepared = context.prepare(variant, dtype=torch.float64)
        outputs = context.run_op(prepared)
        if self.reference is not None:
            verdict = self._float64_reference(variant, prepared, outputs)
            if verdict is not None:
                return verdict
            notes = ["reference= raises there; judged by finite differences instead"]
        else:
            notes = []
        if not all(bool(o.isfinite().all()) for o in outputs if o.is_floating_point()):
            return Verdict(OUTSIDE, reason="the op's outputs hold inf or NaN there")
        if not prepared.leaves:
            return Verdict(RIGHT, notes=notes)
        kinks = KinkNotes()
        error = find_derivative_error(
            lambda leaves: context.run_op(prepared, leaves), prepared.leaves, prepared.names,
            [output_label(k, len(outputs)) for k in range(len(outputs))], context.generator,
            exhaustive_limit=EXHAUSTIVE_ELEMENTS, notes=kinks, outputs=outputs,
            nondifferentiable=declared_nondifferentiable(context.case, outputs), **marker_tolerances(context.case))
        notes += kinks.lines
        if error is None:
            return Verdict(RIGHT, notes=notes)
        return Verdict(WRONG, what=_what(error.argument, error.output), argument=error.argument,
                       output=None if error.output == "all outputs" else error.output, worst=error.worst(),
                       error=error.error_line(), strategy="the derivative engine in float64 (finite differences)",
                       derivative=error, evidence=error.evidence, notes=notes)

    def _float64_reference(self, variant, op_side, op_outputs):
        """Outputs and gradients against the reference's; None when the reference raises there."""
        context = self.context
        ref_side = context.prepare(variant, dtype=torch.float64)
        try:
            ref_outputs = context.run_op(ref_side, fn=self.reference)
        except OpRaised:
            return None
        if self._newly_non_finite(ref_outputs):
            return Verdict(OUTSIDE, reason="the reference's outputs hold inf or NaN there")
        if len(ref_outputs) != len(op_outputs):
            return Verdict(WRONG, what="the number of outputs",
                           worst=f"the op returned {len(op_outputs)} tensor output(s), the reference "
                                 f"{len(ref_outputs)}", strategy=STRATEGY_REFERENCE)
        count = len(op_outputs)
        for k, (expected, got) in enumerate(zip(ref_outputs, op_outputs)):
            label = output_label(k, count)
            found = self._compare(expected, got, label, STRATEGY_REFERENCE, output=label)
            if found is not None:
                return found
        cotangents = random_cotangents(ref_outputs, context.generator)
        pairs = [(e, g, c) for e, g, c in zip(ref_outputs, op_outputs, cotangents)
                 if c is not None and (e.requires_grad or g.requires_grad)]
        if not pairs or not op_side.leaves:
            return Verdict(RIGHT)
        try:
            expected_grads = grads_of([e for e, _, _ in pairs], ref_side.leaves, [c for _, _, c in pairs])
        except OpRaised:
            return None
        got_grads = grads_of([g for _, g, _ in pairs], op_side.leaves, [c.to(g.device) for _, g, c in pairs])
        for name, expected, got in zip(op_side.names, expected_grads, got_grads):
            found = self._compare(expected.detach(), got.detach(), f"grad {name}", STRATEGY_REFERENCE,
                                  argument=name)
            if found is not None:
                return found
        return Verdict(RIGHT)

    def _newly_non_finite(self, outputs):
        """True when the reference's outputs hold inf or NaN at a variant although they are finite at the sample:
        outside the domain (a mean over an empty dim, a fully masked row), where an op may answer otherwise."""
        if all(bool(o.isfinite().all()) for o in outputs if o.is_floating_point()):
            return False
        if self.reference_finite_at_sample is None:
            try:
                reference = self.context.run_op(self.context.prepare(self.sample, dtype=torch.float64),
                                                fn=self.reference)
                self.reference_finite_at_sample = all(bool(o.isfinite().all()) for o in reference
                                                      if o.is_floating_point())
            except (OpRaised, UsageProblem):
                self.reference_finite_at_sample = True
        return self.reference_finite_at_sample

    def _compare(self, expected, got, label, strategy, argument=None, output=None):
        atol, rtol = self.context.tolerance(expected.dtype)
        if agree(expected, got, atol, rtol):
            return None
        mismatch = compare_tensors(expected, got.to(expected.device), atol, rtol)
        if mismatch is None:
            return None
        from pytest_autograd.results.evidence import Evidence

        evidence = [Evidence.of(label, expected, got, mismatch.index)] if mismatch.problem is None else []
        return Verdict(WRONG, what=_what(argument, output), argument=argument, output=output,
                       worst=mismatch.worst(label), error=mismatch.error_line(), strategy=strategy, evidence=evidence)

    # below float64 ---------------------------------------------------------------------------------------

    def _low_precision(self, variant, size_ratio):
        if self.reference is not None:
            verdict = self._low_reference(variant, size_ratio)
            if verdict is not None:
                return verdict
            notes = ["reference= raises there; judged by finite differences instead"]
        else:
            notes = []
        context, dtype = self.context, self.dtype
        prepared = context.prepare(variant, dtype=dtype)
        outputs = context.run_op(prepared)
        if not all(bool(o.isfinite().all()) for o in outputs if o.is_floating_point()):
            return Verdict(OUTSIDE, reason="the op's outputs hold inf or NaN there")
        if not prepared.leaves:
            return Verdict(RIGHT, notes=notes)
        kinks, blind, domain = [], [], []
        error = find_low_precision_error(lambda leaves: context.run_op(prepared, leaves), prepared.leaves,
                                         prepared.names, context.generator, dtype, kinks=kinks, unresolved=blind,
                                         domain=domain)
        notes += [f"kinks at {', '.join(kinks[:3])} (one-sided differences differ): noted, not failed"] if kinks else []
        notes += domain
        if error is None and blind:
            names = ", ".join(f"`{name}`" for name, _ in blind)
            return Verdict(UNRESOLVED, reason=f"the gradient w.r.t. {names}: {blind[0][1]}")
        if error is None:
            return Verdict(RIGHT, notes=notes)
        return Verdict(WRONG, what=_what(error.argument, None), argument=error.argument, worst=error.worst(),
                       error=error.error_line(), strategy=self.plan.strategy(False), derivative=error, notes=notes)

    def _low_reference(self, variant, size_ratio):
        """The op in its dtype against the reference in float64 on the same rounded inputs; None if that raises."""
        if self.sample_errors is None:
            self.sample_errors = {}
            try:
                runs = self._low_runs(self.sample)
            except OpRaised:  # the sample itself is the other checks' business
                runs = None
            if runs is not None:
                op_low, truth, _ = runs
                self.sample_errors = {p.label: normwise_error(p.expected, p.got).value
                                      for p in paired_tensors(truth, op_low)}
        runs = self._low_runs(variant)
        if runs is None:
            return None
        op_low, truth, ref_low = runs
        strategy = self.strategy
        count = len(truth.outputs)
        if len(op_low.outputs) != count:
            return Verdict(WRONG, what="the number of outputs",
                           worst=f"the op returned {len(op_low.outputs)} tensor output(s), the reference {count}",
                           strategy=strategy)
        for k, (expected, got) in enumerate(zip(truth.outputs, op_low.outputs)):
            if tuple(expected.shape) != tuple(got.shape):
                label = output_label(k, count)
                return Verdict(WRONG, what=label, output=label, strategy=strategy,
                               worst=f"shape: expected {list(expected.shape)}, got {list(got.shape)}")
        if self._newly_non_finite(truth.outputs):
            return Verdict(OUTSIDE, reason="the reference's float64 outputs hold inf or NaN there")
        reference_errors = {}
        if ref_low is not None:
            reference_errors = {p.label: normwise_error(p.expected, p.got).value for p in paired_tensors(truth, ref_low)}
        from pytest_autograd.checks.precision import floor

        budgets = {}
        for pair in paired_tensors(truth, op_low):
            own = self.sample_errors.get(pair.label, 0.0) * max(1.0, size_ratio)
            budget = LOW_PRECISION_K * max(reference_errors.get(pair.label, 0.0), own) + floor(self.dtype)
            budgets[pair.label] = max(budget, 16 * floor(self.dtype)) if ref_low is None else budget
        worst = self._worst(truth, op_low, budgets)
        noise = None
        if worst is not None:  # over budget: is it the op's own rounding noise at this size?
            noise = self._rounding_noise(variant, op_low)
            budgets = {label: max(budget, NOISE_K * noise.get(label, 0.0)) for label, budget in budgets.items()}
            worst = self._worst(truth, op_low, budgets)
        if worst is None:
            return Verdict(RIGHT)
        pair, error, budget = worst
        return Verdict(WRONG, what=pair.what, strategy=strategy, worst=error.worst(pair.label),
                       error=(f"normwise error {fmt(error.value)} (max abs error / max |float64 value|) > budget "
                              f"{fmt(budget)} ({fmt(LOW_PRECISION_K)} x the larger of the reference's own error in "
                              f"{dtype_label(self.dtype)} and the op's error at your sample, grown with the size, "
                              f"plus rounding; or {fmt(NOISE_K)} x how far the op's own "
                              f"{dtype_label(self.dtype)} result moves, {fmt(noise.get(pair.label, 0.0))}, when its "
                              f"inputs move by one rounding)"), **pair.fields)

    @staticmethod
    def _worst(truth, op_low, budgets):
        """(pair, error, budget) of the output or gradient furthest over its budget, or None."""
        worst = None
        for pair in paired_tensors(truth, op_low):
            error, budget = normwise_error(pair.expected, pair.got), budgets[pair.label]
            if error.value > budget and (worst is None or error.value / budget > worst[1].value / worst[2]):
                worst = (pair, error, budget)
        return worst

    def _rounding_noise(self, variant, op_low):
        """Label -> how far the op's result in its dtype moves (normwise) when each differentiated input moves by
        about one rounding of the dtype, random signs both ways, the cotangents kept.

        A size where the op's formula cancels (an RMS norm over one element: its gradient is eps / (x^2 + eps)^1.5,
        computed as the difference of two numbers near 1) loses digits in any implementation in that dtype, the
        reference's too when it rounds to the dtype inside. Such an error is noise: it moves about as much as it
        is large when the inputs move by one rounding. A wrong formula or a squeezed dim is systematic: it stays.
        """
        from pytest_autograd.checks._edges import differentiated_slots, nudged

        slots = differentiated_slots(self.context.case, variant)
        low = cast_sample(variant, self.dtype)
        noise = {}
        for sign in (1.0, -1.0):
            moved = cast_sample(nudged(low, slots, self.dtype, sign, self.context.seed, zeros_too=False), self.dtype)
            try:
                again, _ = forward_and_backward(self.context, moved, self.dtype, self.last_cotangents)
            except OpRaised:
                continue
            for pair in paired_tensors(op_low, again):
                noise[pair.label] = max(noise.get(pair.label, 0.0), normwise_error(pair.expected, pair.got).value)
        return noise

    def _low_runs(self, sample):
        """(op in dtype, reference in float64, reference in dtype or None) on the same rounded inputs."""
        low = cast_sample(sample, self.dtype)
        op_low, cotangents = forward_and_backward(self.context, low, self.dtype)
        self.last_cotangents = cotangents
        try:
            truth, _ = forward_and_backward(self.context, low, torch.float64, cotangents, fn=self.reference)
        except ReferenceRaised:
            return None
        try:
            ref_low, _ = forward_and_backward(self.context, low, self.dtype, cotangents, fn=self.reference)
        except ReferenceRaised:
            ref_low = None
        return op_low, truth, ref_low


def first_call_may_compile(device):
    """Whether an op's first call at a new shape on ``device`` may compile kernels for it: GPU kernels are often
    compiled at first use for the sizes they see (Triton, torch.compile, NVRTC); CPU kernels rarely are."""
    return not str(device).startswith("cpu")


def refusal(raised):
    """A Verdict for an op that raised at a variant (an OpRaised): refused (outside its contract), or wrong when
    autograd refuses the shape of a gradient its backward returned; refused for a UsageProblem (no tensor output
    there: nothing to judge)."""
    if isinstance(raised, UsageProblem):
        return Verdict(REFUSED, reason=str(raised).split(". ")[0])
    text = str(raised.error)
    first = text.strip().splitlines()[0] if text.strip() else ""
    if raised.phase == "backward" and INVALID_GRADIENT in text:
        return Verdict(WRONG, what="the gradient's shape", raised=raised,
                       worst=f"{type(raised.error).__name__}: {first}")
    reason = f"{type(raised.error).__name__}: {first[:160]}"
    return Verdict(REFUSED, reason=reason if raised.phase == "forward" else f"its backward raises {reason}",
                   raised=raised)


def _what(argument, output):
    if argument is not None:
        return f"gradient w.r.t. `{argument}`"
    return output or "output"


def size_ratio(old, new):
    return new / old if old else math.inf
