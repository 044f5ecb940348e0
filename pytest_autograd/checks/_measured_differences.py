"""Central differences in a low dtype, with a measured tolerance.

For an op that cannot run in float64 and has no reference. Central
differences at three steps ``2h, h, h/2`` (``h = eps^(1/3) max|x|``); the
perturbed inputs are rounded to the dtype and the analytical side uses
exactly the rounded step, so input rounding costs nothing. A wrong gradient
is an error that stays the same whatever the step; truncation and rounding
errors change with it, so the spread across steps (plus the rounding of the
outputs that moved) is the tolerance. At a kink, where one-sided
differences jump, an analytical value equal to one side or between them is
noted, not failed. A probe whose three differences disagree by more than
the derivative they measure (an op whose output, in that dtype, changes
faster than the steps can follow) cannot tell any gradient from another:
it is judged again at smaller steps, and an argument that no probe could
judge is reported as not judged, never as passed.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._domain_edges import elements_leaving_the_domain
from pytest_autograd.checks._numerical import DerivativeError, pick, spent_graph
from pytest_autograd.checks._same_draws import default_draws, with_same_draws
from pytest_autograd.engine.execution import (
    OpRaised,
    differentiable_indices,
    grads_of,
    random_cotangents,
)
from pytest_autograd.results.compare import dtype_label, fmt, fmt_index, unravel

STEP_FACTORS = (2.0, 1.0, 0.5)  # of the base step eps ** (1/3) * max|x|
ELEMENT_PROBES = 6  # per argument, besides two random directions
NOISE_ULPS = 4  # rounding allowance on the outputs that moved and on the analytical side
SPREAD_FACTOR = 3.0  # how many times the measured spread across steps is tolerated
RELATIVE_FLOOR_ULPS = 4  # relative allowance on the projected derivative, in eps ** (2/3)
LEAF_FLOOR_ULPS = 4  # allowance on an element probe relative to the argument's largest gradient, in eps ** (2/3)
HOEFFDING = 6.0  # L2 norms of per-output rounding bounds that a random-signed sum stays within (see _rounding_bound)
FINER_STEPS = (1 / 16, 1 / 256, 1 / 4096)  # of the base step: where a probe that is not steady tries again
CONFIRMING_STEP = 0.6180339887  # of the base step, no power of 2: where a steady failure must show again


class Unresolved(str):
    """A probe's label, for a probe whose differences at its steps disagree by more than the derivative they
    measure: it would pass any gradient, a zero one too (see ``_resolves``)."""

    failed_at_base = False  # whether it failed at the base step (then its argument is not judged, whatever the
    # other probes say: a finer step contradicted the failure without settling the derivative)
    outside = False  # its outputs were not finite at any step, while finite at the point: the op's domain ends there

    def __new__(cls, label, measured):
        made = super().__new__(cls, label)
        made.measured = measured  # what the probe saw, for the report
        return made


def find_low_precision_error(fn, leaves, names, generator, dtype, needs_grad=False, kinks=None, ties=None,
                             unresolved=None, domain=None, draws=None):
    """Worst DerivativeError of ``fn(leaves) -> outputs`` (leaves in ``dtype``), or None.

    ``unresolved``, a list, receives ``(argument name, what a probe measured)``
    per argument that no probe could judge (see ``Unresolved``): the caller
    must say so, not pass it.

    ``kinks``, a list, receives the probes where one-sided differences differ
    and the analytical value is one of them or between them: a kink (relu,
    clamp, max with ties), noted rather than failed. ``ties``, a list: a
    failure where arguments hold tied values is judged again at a tie-free
    point (see ``_ties``); when it passes there, the ties are described in it. Every evaluation of ``fn`` starts
    its random numbers from ``draws`` (a ``_same_draws.Draws``), so an op drawing them draws alike in each.
    """
    fn = with_same_draws(fn, default_draws(leaves) if draws is None else draws)
    found = _find_low_precision_error(fn, leaves, names, generator, dtype, needs_grad, kinks, unresolved, domain)
    if found is None or found.smooth or ties is None:
        return found
    from pytest_autograd.checks._ties import MIN_STEP_OVER_EPS, find_ties, tie_free

    tied = find_ties(leaves, names)
    if not tied:
        return found
    eps = torch.finfo(dtype).eps
    # The largest difference step must stay far below the tie-breaking step: no probe may reorder the ties.
    largest_steps = [2 * max(STEP_FACTORS) * eps ** (1 / 3) * (float(leaf.detach().abs().max()) or 1.0)
                     / MIN_STEP_OVER_EPS if leaf.numel() else 0.0 for leaf in leaves]
    moved = tie_free([leaf.detach().to(torch.float64) for leaf in leaves], tied, generator, largest_steps)
    if moved is None:
        return found
    moved = [m.to(leaf.dtype).requires_grad_(True) for m, leaf in zip(moved, leaves)]
    if find_ties(moved, names):  # rounding to the dtype tied them again
        return found
    again = _find_low_precision_error(fn, moved, names, generator, dtype, needs_grad, kinks, unresolved, domain)
    if again is not None:
        again.strategy += "; at a tie-free point (the sample's tied values moved apart), so not the tie's"
        return again
    ties.append(f"{tied.describe(names)}: {found.worst()} at the tie; judged at a tie-free point instead")
    return None


def _find_low_precision_error(fn, leaves, names, generator, dtype, needs_grad=False, kinks=None, unresolved=None,
                              domain=None):
    outputs = fn(leaves)
    diff = differentiable_indices(outputs)
    if not diff or not leaves:
        return None
    outputs = [outputs[k] for k in diff]
    cotangents = random_cotangents(outputs, generator)
    # Copies: a memory-saving backward returns the very buffers forward saved, which its next run overwrites.
    analytical = [g.detach().to(torch.float64, copy=True)
                  for g in grads_of(outputs, leaves, cotangents, retain_graph=True)]
    eps = torch.finfo(dtype).eps
    worst = _sign_error(analytical, _negated_grads(fn, leaves, diff, outputs, cotangents), names, eps)
    if worst is not None:  # or backward spoiled its own graph (it wrote into what forward saved): ask a fresh one
        worst = _sign_error(analytical, _negated_grads(fn, leaves, diff, None, cotangents), names, eps)
    cotangents64 = [c.detach().to(torch.float64) for c in cotangents]

    def evaluate(moved):
        with torch.set_grad_enabled(needs_grad):
            if needs_grad:
                moved = [m.detach().requires_grad_(True) for m in moved]
            outs = fn(moved)
        return [outs[k].detach().to(torch.float64) for k in diff]

    center = [out.detach().to(torch.float64) for out in outputs]  # the unmoved point: the forward just run
    for j, leaf in enumerate(leaves):
        x = leaf.detach().to(torch.float64)
        peak = float(x.abs().max()) if x.numel() else 0.0
        base = eps ** (1 / 3) * (peak if peak > 0 else 1.0)
        leaf_scale = float(analytical[j].abs().max()) if analytical[j].numel() else 0.0
        told, blind = False, []  # told: a probe told the derivative from zero and from twice itself
        noted = False
        for label, direction in _directions(leaf, generator):
            def judge(step, finer=False, direction=direction, label=label):
                return _judge_direction(evaluate, leaves, j, x, direction, step, dtype, cotangents64, analytical[j],
                                        names[j], label, eps, leaf_scale, center, finer)

            found, probe = _judge_at_scales(judge, base, label)
            if getattr(found, "outside", False) and direction.count_nonzero() > 1:
                # the finest scale's largest step: a probe there moves by up to max(STEP_FACTORS) times the scale
                finest = max(STEP_FACTORS) * base * FINER_STEPS[-1]
                edges = _domain_edges(evaluate, leaves, j, x, direction, finest, dtype)
                if edges and domain is not None and not noted:
                    domain.append(_edges_line(names[j], x, edges, finest))
                    noted = True
                if edges:  # judged over every other element
                    kept = direction.clone()
                    kept.view(-1)[edges] = 0.0
                    found, probe = _judge_at_scales(lambda step, finer=False: judge(step, finer, kept), base, label)
            if isinstance(found, DerivativeError) and direction.count_nonzero() > 1:
                found, probe = _split_off_dominant(judge, base, label, analytical[j], direction, found, probe, x,
                                                   dtype)
            if isinstance(found, Unresolved):
                blind.append(found)
            elif isinstance(found, str):
                if kinks is not None:
                    kinks.append(found)
            elif found is None:
                told = told or probe.tells()
                if not told and not probe.flat():
                    blind.append(Unresolved(label, probe.described(label)))
            else:
                worst = pick(worst, found)
        if blind and (not told or any(b.failed_at_base for b in blind)) and unresolved is not None:
            unresolved.append((names[j], blind[0].measured))
    return worst


def _judge_at_scales(judge, base, label, first=None):
    """The probe's verdict at step ``base``, or, where that is a failure the probe is not steady for or a pass
    it cannot resolve (see ``Probe``), at the first finer scale (``FINER_STEPS`` of it) where the probe is steady
    and tells the derivative from zero and from twice itself.

    An output that changes on a scale finer than the step (``sin(50 x)`` at
    ``x ~ 100``, a row norm of a near-zero row) averages its slopes over the
    steps: the differences read a derivative it does not have, so a right
    gradient fails there and a zero one passes. Its one-sided differences
    jump by more than the tolerance and do not shrink with the step, as at a
    kink, or its differences disagree by more than their own size. Where no
    finer scale is steady, the base verdict stands unless a finer scale
    measured a different derivative beyond both tolerances (at a kink at
    the point itself, its central difference is the mean of its two slopes
    whatever the step); then the probe judges nothing (``Unresolved``). A
    pass or a kink at ``base`` stands as it is. ``first``: the probe at ``base``, when the caller has it.
    """
    first = judge(base) if first is None else first
    if first.outside:  # a step left the op's domain (sqrt near 0): judged from the first finer step inside it
        tried = ((base * shrink, judge(base * shrink, finer=True)) for shrink in FINER_STEPS)
        inside = next(((step, probe) for step, probe in tried if not probe.outside), None)
        if inside is None:
            unresolved = Unresolved(label, measured=f"at {label}: the outputs turn inf/NaN at every step down to "
                                                    f"{fmt(base * FINER_STEPS[-1])}, where they are finite at the "
                                                    "sample itself: the op's domain ends nearer than that")
            unresolved.outside = True
            return unresolved, first
        step, probe = inside
        return _judge_at_scales(lambda step, finer=False: judge(step, finer=True), step, label, probe)
    verdict = first.verdict
    if verdict is None or (isinstance(verdict, str) and not isinstance(verdict, Unresolved)) \
            or first.measured is None:  # a pass, a kink, or differences that are not finite: it stands
        return verdict, first
    # Differences that see less than half the change the gradient predicts, at every step alike: the reading of
    # steps far coarser than the output's turns (their average slope is about 0), or a gradient too large.
    # Only a finer step tells which.
    coarse = isinstance(verdict, DerivativeError) and abs(first.measured) < 0.5 * abs(first.predicted)
    steady = first.steady and not coarse
    probes = [first]
    for shrink in (CONFIRMING_STEP,) * steady + FINER_STEPS:
        probe = judge(base * shrink, finer=shrink < CONFIRMING_STEP)
        if probe.steady and probe.tells() and (probe.verdict is None or isinstance(probe.verdict, DerivativeError)):
            return probe.verdict, probe
        probes.append(probe)
    if steady and isinstance(probes[1].verdict, DerivativeError) and probes[1].steady:
        return verdict, first  # confirmed at an unrelated step
    if isinstance(verdict, DerivativeError):  # contradicted by a finer step that passes and would have seen its
        # error, or, for a failure found by extrapolating a coarse reading's errors (no truncation errors there),
        # by one whose differences lie nearer the gradient than the coarse reading
        error = abs(first.measured - first.predicted)
        contradicted = any(p.measured is not None and (
            p.verdict is None and p.tolerance < error
            or coarse and first.extrapolated and abs(p.measured - first.predicted) < abs(p.measured - first.measured))
            for p in probes[1:])
    else:  # a blind pass: contradicted by a finer step measuring another derivative
        contradicted = first.measured is not None and any(
            p.measured is not None and abs(p.measured - first.measured) > p.tolerance + first.tolerance
            for p in probes[1:])
    if not contradicted:
        return verdict, first
    measured = ", ".join(fmt(p.measured) for p in probes if p.measured is not None)
    unresolved = Unresolved(label, measured=f"at {label}: central differences {measured} at steps shrinking "
                                            "16-fold, none steady")
    unresolved.failed_at_base = isinstance(verdict, DerivativeError)
    return unresolved, first


@dataclass
class Probe:
    """One probe at one step scale: its verdict (None: agrees; a str: a kink; ``Unresolved``; a DerivativeError),
    whether it is steady (its differences agree across its steps better than their own size, and its one-sided
    differences agree or jump less as the step shrinks: the output is smooth at this scale), and the central
    difference and tolerance at its smallest step."""

    verdict: object
    steady: bool = True
    measured: float = None
    tolerance: float = None
    predicted: float = None  # the analytical side of ``measured``
    span: float = 0.0  # the argument's largest gradient times the probe direction's L1 norm
    extrapolated: bool = False  # failed only where its errors were extrapolated to a zero step
    outside: bool = False  # its steps left the op's domain: outputs finite at the point, not at the moved points

    def tells(self):
        """Whether the probe tells the derivative it measured from zero and from twice itself (either is off by
        the derivative itself)."""
        return self.measured is not None and self.tolerance < abs(self.measured)

    def flat(self):
        """Whether both sides agree the derivative is about zero here (a saturated output), within a tolerance
        below half of what the argument's largest gradient would give along the probe (``span``)."""
        return self.measured is not None and abs(self.measured) <= self.tolerance and \
            abs(self.predicted) <= self.tolerance < 0.5 * self.span

    def described(self, label):
        if self.measured is None:
            return f"at {label}: no step moved the argument or the outputs"
        return (f"at {label}: central difference {fmt(self.measured)} within a tolerance of {fmt(self.tolerance)}, "
                "which a zero gradient, or twice the right one, would pass")


def _negated_grads(fn, leaves, diff, outputs, cotangents):
    """backward(-v) through ``outputs``' graph, or (``outputs`` None, or that graph refusing a second run) through
    a forward run anew on fresh copies of the leaves."""
    flipped = [-c for c in cotangents]
    if outputs is not None:
        try:
            return grads_of(outputs, leaves, flipped, retain_graph=True)
        except OpRaised as raised:
            if not spent_graph(raised):
                raise
    fresh = [leaf.detach().clone().requires_grad_(True) for leaf in leaves]
    with torch.enable_grad():
        again = fn(fresh)
    return grads_of([again[k] for k in diff], fresh, flipped)


def _judge_direction(evaluate, leaves, j, x, direction, base, dtype, cotangents64, grad, name, label, eps,
                     leaf_scale, center, finer=False):
    """The Probe at base step ``base``: its verdict (None when it agrees, the label, a str, at a kink, ``Unresolved``
    when its steps cannot tell any gradient from another, else a DerivativeError) and whether it is steady.

    ``finer``: a step below the base one, where truncation is already small: no Richardson extrapolation, which
    would read an ill-conditioned kernel's rounding (cos of a large float32 argument) as an error that converged."""
    errors, predicted_values, floors, one_sided, factors = [], [], [], [], []
    # One element moved: a kink inside the steps is a jump that does not shrink (see _at_kink), so its errors may
    # be extrapolated. A random direction crosses more kinks the larger the step, an error linear in it that
    # extrapolation would keep.
    extrapolate = "random" not in label and not finer
    per_step = []  # (rounding noise summed as a random walk, stuck outputs' terms, width), for the extrapolation
    for factor in STEP_FACTORS:
        step = base * factor
        plus, minus = (x + step * direction).to(dtype), (x - step * direction).to(dtype)
        delta = plus.to(torch.float64) - minus.to(torch.float64)
        if not bool((delta != 0).any()):
            continue
        moved_plus = [leaf.detach() for leaf in leaves]
        moved_minus = list(moved_plus)
        moved_plus[j], moved_minus[j] = plus, minus
        out_plus, out_minus = evaluate(moved_plus), evaluate(moved_minus)
        change = sum(float(((p - m) * v).sum()) for p, m, v in zip(out_plus, out_minus, cotangents64))
        moved_terms = [(p.abs() + m.abs()) * v.abs() * (p != m) for p, m, v in zip(out_plus, out_minus, cotangents64)]
        predicted = float((grad * delta).sum())
        width = 2 * step
        errors.append((change - predicted) / width)
        factors.append(factor)
        right = sum(float(((p - c) * v).sum()) for p, c, v in zip(out_plus, center, cotangents64))
        left = sum(float(((c - m) * v).sum()) for c, m, v in zip(center, out_minus, cotangents64))
        one_sided.append(((right - float((grad * (plus.to(torch.float64) - x)).sum())) / step,
                          (left - float((grad * (x - minus.to(torch.float64))).sum())) / step))
        predicted_values.append(predicted / width)
        # An output that did not move at all may still have changed by up to one rounding in each evaluation:
        # below that resolution a small true derivative reads as 0 at every step (rms_norm over one element).
        stuck_terms = [c.abs() * v.abs() * (p == m) for p, m, c, v in zip(out_plus, out_minus, center, cotangents64)]
        analytical_terms = [grad.abs() * delta.abs()]
        floors.append(eps * (NOISE_ULPS * (_l1(moved_terms) + _l1(analytical_terms)) + _l1(stuck_terms)) / width)
        if extrapolate:
            per_step.append((eps * (_random_walk(moved_terms, NOISE_ULPS) + _random_walk(analytical_terms, NOISE_ULPS))
                             / width, stuck_terms, width))
    if len(errors) < 2 or not all(math.isfinite(e) for e in errors):
        if errors and not all(math.isfinite(e) for e in errors):
            return Probe(DerivativeError("all outputs", name, f"grad {name}{label}", math.nan, math.nan, math.inf,
                                         0.0, "central differences in " + dtype_label(dtype), False, True),
                         outside=all(bool(c.isfinite().all()) for c in center))
        return Probe(None)
    spread = max(errors) - min(errors)
    # The best relative accuracy of central differences is about eps ** (2/3): allowed on this direction's
    # derivative, and (a few times) on the argument's largest gradient, where quantised outputs move.
    scale = max(abs(p) for p in predicted_values)
    reach = leaf_scale * float(direction.abs().sum()) if label.startswith("[") and "random" not in label else 0.0
    tolerance = (SPREAD_FACTOR * spread + max(floors)
                 + eps ** (2 / 3) * (RELATIVE_FLOOR_ULPS * scale + LEAF_FLOOR_ULPS * reach))
    best = min(range(len(errors)), key=lambda i: abs(errors[i]))
    extrapolated = _extrapolated_error(errors, factors, _noise(per_step, eps), math.sqrt(eps) * scale) \
        if extrapolate else None
    right, left = one_sided[-1]
    first_jump = one_sided[0][0] - one_sided[0][1]
    resolved = _resolves(errors, predicted_values, floors)
    jump_settles = abs(right - left) <= tolerance or abs(right - left) < 0.5 * abs(first_jump)
    probe = Probe(None, steady=resolved and jump_settles,
                  measured=predicted_values[-1] + errors[-1], tolerance=tolerance, predicted=predicted_values[-1],
                  span=leaf_scale * float(direction.abs().sum()))
    if abs(errors[best]) <= tolerance and extrapolated is None:
        if not resolved:
            differences = ", ".join(fmt(e + p) for e, p in zip(errors, predicted_values))
            probe.verdict = Unresolved(f"grad {name}{label}", f"at grad {name}{label}: differences {differences} "
                                                              "at three steps")
        return probe
    if abs(errors[best]) > tolerance:
        error, allowed = errors[best], tolerance
        why = f"the error stays at {', '.join(fmt(e) for e in errors)} whatever the step"
    else:
        error, allowed = extrapolated
        probe.extrapolated = True
        why = (f"the errors {', '.join(fmt(e) for e in errors)} converge to {fmt(error)} as the step shrinks "
               "(Richardson extrapolation removes the steps' own truncation error)")
    if _at_kink(one_sided, allowed, one_element=extrapolate):  # a jump the steps straddle: not smooth
        probe.verdict = f"grad {name}{label}"
        return probe
    steps = ", ".join(fmt(base * f) for f in factors)
    got = predicted_values[-1]
    expected = got + error
    probe.verdict = DerivativeError(
        output="all outputs", argument=name, element=f"grad {name}{label}", expected=expected, got=got,
        abs_error=abs(error), tolerance=allowed,
        strategy=(f"central differences in {dtype_label(dtype)} at steps {steps}; {why}, so it is the "
                  "gradient's, not rounding's"),
        argument_grad_all_zero=bool((grad == 0).all()), numerical_nonzero=expected != 0.0,
    )
    return probe


def _resolves(errors, predicted, floors):
    """Whether the steps' differences agree well enough to judge a gradient: the tolerance's spread term
    (``SPREAD_FACTOR`` times the disagreement between steps) stays below the derivative measured, or the
    differences are at rounding's level (a flat direction, judged by the floors). An output that changes faster
    than the steps can follow (``sin(50 x)`` at ``x ~ 100`` in float32) gives differences that are noise of the
    derivative's own size: a zero backward would pass there."""
    measured = [abs(e + p) for e, p in zip(errors, predicted)]
    noise = SPREAD_FACTOR * (max(errors) - min(errors))
    return noise < max(measured) or max(measured) <= max(floors)


def _l1(terms):
    return sum(float(t.sum()) for t in terms)


def _random_walk(terms, ulps):
    """How far ``sum(v_i r_i)`` may be from 0 when each rounding ``r_i`` is at most ``ulps`` of its own term
    (``|value_i| |v_i|``, in units of eps): ``ulps`` x the L1 norm at worst, and over many terms a bound the sum
    exceeds with a chance below 1e-7.

    The cotangent's and the direction's signs are drawn independently of
    the op, so roundings (and the changes an output too flat to move at a
    step may hide) add up like a random walk: Hoeffding's bound,
    ``sqrt(2 ln(2 / 1e-7)) ~ 6`` times the L2 norm of the per-term bounds.
    The L1 norm grows with the number of outputs, until on a 64 x 64 tensor
    a gradient wrong by half fits inside it.
    """
    flat = torch.cat([t.reshape(-1) for t in terms]) if terms else torch.zeros(0, dtype=torch.float64)
    return min(ulps * float(flat.sum()), HOEFFDING * float(flat.norm()))


def _noise(per_step, eps):
    """The largest rounding noise of the steps' errors, each output that never moved at any step taken as
    flat over the widest one.

    An output that did not move at a step may hide a change of up to one
    rounding; one that moved at no step at all changed by less than that
    over the widest step, so at a narrower one it hides proportionally
    less. Most such outputs do not depend on the element moved at all: the
    L1 sum over them once made the tolerance as large as the gradient.
    """
    never = None
    for _, stuck_terms, _ in per_step:
        moved_nowhere = [t != 0 for t in stuck_terms]
        never = moved_nowhere if never is None else [a & b for a, b in zip(never, moved_nowhere)]
    widest = max(width for _, _, width in per_step)
    noise = 0.0
    for rounding, stuck_terms, width in per_step:
        scaled = [t * torch.where(n, width / widest, 1.0) for t, n in zip(stuck_terms, never)]
        noise = max(noise, rounding + eps * _random_walk(scaled, 1) / width)
    return noise


def _extrapolated_error(errors, factors, noise, floor):
    """(error, tolerance) when the errors, freed of their steps' truncation error, converge to a value that is
    not 0, else None.

    A central difference's truncation error shrinks as the step squared; a
    wrong gradient's error does not shrink at all. Low dtypes need large
    steps, where truncation can hide an error of half the gradient inside
    the spread across steps. Richardson's ``(4 e(h) - e(2h)) / 3`` removes
    the ``h^2`` term; two such values from three halving steps must agree on
    a value other than 0, beyond their own disagreement and the rounding
    noise, ``noise`` at the smallest step, and beyond ``floor`` (``sqrt(eps)``
    of the derivative: below that, an ill-conditioned kernel's own rounding,
    such as ``cos`` of a large float32 argument in its backward, is no bug).
    """
    if len(errors) < 3 or any(b != 2 * a for a, b in zip(factors[1:], factors)):
        return None
    coarse, fine = ((4 * errors[i + 1] - errors[i]) / 3 for i in range(2))
    # fine's own rounding: 4/3 of the smallest step's plus 1/3 of the next one's (half of it); its truncation
    # left over (the h^4 term) is a fifteenth of its distance to coarse. A constant error makes both the same:
    # where they differ by half of fine, it is noise the rounding estimate missed (an ill-conditioned forward,
    # sin of a large float32 argument), not an error that converged.
    tolerance = 2 * abs(coarse - fine) + 1.5 * noise + floor
    if abs(fine) <= tolerance or coarse * fine <= 0:
        return None
    return fine, tolerance


def _at_kink(one_sided, tolerance, one_element=True):
    """One-sided differences that differ by a jump that does not shrink with the step, with the analytical
    value equal to one of them or between them: a kink, where central differences average two slopes.

    A random direction may cross several kinks at once, where each element's subgradient sits between its
    own slopes but their sum need not sit between the direction's two one-sided slopes: there a kink is
    enough, and the element probes judge the elements one by one.
    """
    right, left = one_sided[-1]  # the smallest step
    jump, first_jump = right - left, one_sided[0][0] - one_sided[0][1]
    if abs(jump) <= tolerance or abs(jump) < 0.5 * abs(first_jump):
        return False  # the sides agree, or they differ only by curvature, which shrinks with the step
    return not one_element or right * left <= 0 or min(abs(right), abs(left)) <= tolerance


def _sign_error(analytical, negated, names, eps):
    """backward(-v) must be -backward(v), up to rounding."""
    worst = None
    for name, g, n in zip(names, analytical, negated):
        n = n.detach().to(torch.float64)
        error = (g + n).abs()
        tolerance = NOISE_ULPS * eps * (float(g.abs().max()) if g.numel() else 0.0) + 1e-30
        if g.numel() and float(error.max()) > tolerance:
            flat = int(torch.argmax(error))
            index = unravel(flat, g.shape)
            found = DerivativeError(
                "all outputs", name, f"grad {name}{fmt_index(index)} for -grad_output", float(-g[index]),
                float(n[index]), float(error[index]), tolerance,
                "negated random cotangent; the gradient for -grad_output must be minus the gradient for "
                "grad_output, so backward is not linear in grad_output (e.g. right only for positive grad_outputs)",
                False, True, smooth=True)
            worst = pick(worst, found)
    return worst


def _split_off_dominant(judge, base, label, grad, direction, found, probe, x, dtype):
    """A random direction's failure judged again in two parts, when one element carries over half its analytical
    ``|grad . direction|``: that element alone, and the direction without it, each at the steps it needs.

    Near a pole (``log``'s backward ``grad / x`` at an element nearer 0 than
    the step) that element's derivative is orders of magnitude above the
    others', and the step carries it across the pole, where the differences
    mean nothing, with nothing non-finite to say so. The gradient is right
    along the direction exactly when it is right along both parts: a failure
    of either stands; when neither fails, the first verdict was the step's.
    """
    terms = (grad.to(torch.float64) * direction).abs().reshape(-1)
    total, flat = float(terms.sum()), int(terms.argmax())
    if not total > 0 or not float(terms[flat]) > 0.5 * total:
        return found, probe
    rest, alone = direction.clone(), torch.zeros_like(direction)
    rest.view(-1)[flat] = 0.0
    alone.view(-1)[flat] = 1.0
    where = fmt_index(unravel(flat, tuple(direction.shape))) if direction.dim() else ""
    # The element alone moves by a step of its own size's scale: a singularity at 0 lies |x| away from it.
    own = abs(float(x.reshape(-1)[flat])) * torch.finfo(dtype).eps ** (1 / 3)
    parts = [_judge_at_scales(lambda step, finer=False: judge(step, finer, rest), base, label),
             _judge_at_scales(lambda step, finer=False: judge(step, finer, alone, where), min(base, own or base),
                              where)]
    for part in parts:
        if isinstance(part[0], DerivativeError):
            return part
    return next((part for part in parts if isinstance(part[0], Unresolved)), parts[0])


def _domain_edges(evaluate, leaves, j, x, direction, step, dtype):
    """Flat indices of the elements of argument ``j`` whose ``step`` along ``direction`` alone makes the outputs
    non-finite (see ``_domain_edges.elements_leaving_the_domain``)."""
    flat_direction = direction.reshape(-1)

    def stays_finite(low, high):
        part = torch.zeros_like(flat_direction)
        part[low:high] = flat_direction[low:high]
        for sign in (1.0, -1.0):
            moved = [leaf.detach() for leaf in leaves]
            moved[j] = (x + sign * step * part.view(x.shape)).to(dtype)
            if not all(bool(out.isfinite().all()) for out in evaluate(moved)):
                return False
        return True

    return elements_leaving_the_domain(x.numel(), stays_finite)


def _edges_line(name, x, edges, step):
    examples = ", ".join(f"{name}{fmt_index(unravel(flat, tuple(x.shape)))} = {fmt(float(x.reshape(-1)[flat]))}"
                         for flat in edges[:3])
    return (f"{len(edges)} element(s) of `{name}` within {fmt(step)} of where the op stops being finite (the finest "
            f"step still leaves its domain), e.g. {examples}: left out of the random directions, every other "
            "element judged")


def _directions(leaf, generator):
    """Element probes (every element of a small argument, else corners and random ones) and two random directions."""
    shape = tuple(leaf.shape)
    numel = leaf.numel()
    if numel == 0:
        return []
    if numel <= ELEMENT_PROBES:
        flats = list(range(numel))
    else:
        chosen = torch.randperm(numel - 2, generator=generator)[: ELEMENT_PROBES - 2] + 1
        flats = [0, numel - 1] + sorted(int(i) for i in chosen)
    probes = []
    for flat in flats:
        direction = torch.zeros(numel, dtype=torch.float64)
        direction[flat] = 1.0
        index = unravel(flat, shape) if shape else ()
        probes.append((fmt_index(index), direction.view(shape).to(leaf.device)))
    for _ in range(2):
        direction = torch.randn(shape, generator=generator, dtype=torch.float64)
        probes.append(("[...] . random direction", direction.to(leaf.device)))
    return probes

