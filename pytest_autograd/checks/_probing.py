"""The probing strategy for inputs too large for the full Jacobian.

One backward along a random cotangent ``v`` gives ``g = J^T v``. Each probe
moves every element of every argument at once along a random direction
``d`` (random signs, magnitudes in [1, 2]) and compares ``g . d`` with the
central difference of ``<v, fn>``. A single wrong element of ``g`` changes
``g . d`` by its error times ``|d_i| >= 1``, whatever the input size, so it
is caught whenever that error exceeds the tolerance; several elements wrong
together (a slice, a tile, an edge) cancel only with small probability,
smaller with each independent probe.

The tolerance is measured, not assumed: ``atol`` plus a multiple of the
probe's own finite-difference error, estimated from a second step size
(half the first). It does not grow with the input size, unlike
``rtol * sum|g . d|``. A probe that disagrees is located by group testing:
a ramp-weighted probe guesses the element, and when the guess does not
confirm, bisection finds it in about log2(n) probes; the element is then
judged alone as the exhaustive path would judge it, and the report names it.

A step may leave the op's domain: ``sqrt`` or ``log`` of ``torch.rand``
samples holds elements closer to 0 than the step (a 256k-element sample
does, one time in three), and the moved outputs are NaN there while the op
is right. Such probes are measured again at finer steps (``well_inside``)
until every one stays inside, and the note says so; where none does, the
few elements whose step alone leaves the domain are found by bisection and
left out of the probes, named in the note. Where more than
``DOMAIN_EDGES`` are, the non-finite differences stand as the failure.
"""

import math

import torch

from pytest_autograd.checks._domain_edges import edge_examples, elements_leaving_the_domain, well_inside
from pytest_autograd.checks._kinks import kink_mask
from pytest_autograd.checks._numerical import DerivativeError, projected_difference
from pytest_autograd.checks._probed_patterns import probed_pattern
from pytest_autograd.engine.draws import probe_direction
from pytest_autograd.results.compare import fmt_index

PROBES = 3  # independent whole-input directions
NOISE_FACTOR = 8.0  # tolerance = atol + NOISE_FACTOR * measured finite-difference error
OBVIOUS = 1000.0  # a residual above OBVIOUS * atol is located before the probes' noise is measured
BLURRED_RTOL = 1e-3  # a tolerance above atol + this x |the derivative along a probe| is a blurred pass


def probing(evaluator, outputs, names, cotangents, analytical, generator, atol, rtol, eps, notes, precomputed=None):
    """The worst DerivativeError found by whole-input probes, or None. ``precomputed`` (a Precomputed): the
    first probes' directions and evaluations, made by another computation of the same sample."""
    n = evaluator.numel
    if n == 0:
        return None
    f0 = [out.detach() for out in outputs]
    g = torch.cat([a.detach().reshape(-1).to(torch.float64) for a in analytical])
    prober = _Prober(evaluator, f0, cotangents, g, eps, atol, rtol)
    given = list(precomputed.directions)[:PROBES] if precomputed is not None else []
    probes = [prober.probe(d, evaluated=lambda sign, k=k: precomputed.at(k, sign)) for k, d in enumerate(given)]
    probes += [prober.probe(probe_direction(n, generator, evaluator.device)) for _ in range(PROBES - len(given))]
    if not all(p.finite() for p in probes) and all(bool(out.isfinite().all()) for out in f0 if out.is_floating_point()):
        inside = _inside_the_domain(prober, [p.direction for p in probes], names, notes)
        if inside is not None:
            prober, probes = inside
    if all(abs(p.residual) <= atol for p in probes):  # within atol: no tolerance can be tighter
        return None
    worst = max(probes, key=lambda p: _magnitude(p.residual))
    if _magnitude(worst.residual) > OBVIOUS * atol:  # far above any plausible noise: name the element first
        start = prober.count
        found = _confirmed(prober, _ramp_guesses(prober, worst.direction, worst.residual), names, notes)
        if found is not None:
            return _every_argument(prober, _located(found, prober.count - start, prober.evaluator.numel),
                                   worst.direction, names, notes)
    for p in probes:
        p.measure_noise(prober)
    tolerance = atol + NOISE_FACTOR * max(p.noise for p in probes)
    if notes is not None and tolerance > atol + BLURRED_RTOL * max(abs(p.central) for p in probes):
        notes.blurred = True  # a wrong gradient could pass within this: the caller asks why (float32 inside?)
    failing = sorted((p for p in probes if not abs(p.residual) <= tolerance), key=lambda p: -_magnitude(p.residual))
    for p in failing:
        if p.at_kink(tolerance):
            if notes is not None:
                notes.add_probe(", ".join(f"`{name}`" for name in names), p.left, p.right, p.analytical)
            continue
        return _every_argument(prober, _locate(prober, p, names, tolerance, notes), p.direction, names, notes)
    return None


def _inside_the_domain(prober, directions, names, notes):
    """(prober, probes) at a finer step well inside the op's domain for every probe (``well_inside``), or at the
    finest step with the elements whose step alone leaves the domain left out; None when neither helps (the
    failure stands)."""
    def measure(step):
        finer = prober.with_step(step)
        probes = [finer.probe(d) for d in directions]
        return all(p.finite() for p in probes), (finer, probes)

    inside, (finer, probes) = well_inside(measure, prober.eps)
    if inside:
        if notes is not None:
            notes.add_domain_step("along a random direction over " + ", ".join(f"`{name}`" for name in names),
                                  prober.eps, finer.eps)
        return finer, probes
    edges = set()
    for probe in probes:  # at the finest step: each direction's own (their magnitudes differ)
        found = None if probe.finite() else _domain_edges(finer, probe.direction)
        if found is None and not probe.finite():
            return None
        edges.update(found or ())
    edges = sorted(edges)
    kept = torch.ones_like(directions[0])
    kept[edges] = 0.0
    probes = [finer.probe(d * kept) for d in directions]
    if not all(p.finite() for p in probes):
        return None
    if notes is not None:
        notes.add_domain_edges(len(edges), edge_examples(finer.evaluator, names, edges), finer.eps)
    return finer, probes


def _domain_edges(prober, direction):
    """Flat indices of the elements whose step along ``direction`` alone makes the outputs non-finite."""
    return elements_leaving_the_domain(
        prober.evaluator.numel, lambda low, high: prober.stays_finite(_restricted(direction, low, high)))


def _every_argument(prober, found, direction, names, notes):
    """``found`` (one argument's located element) with the pattern of its argument and every other wrong
    argument, each located on its own, as ``found.others``."""
    leaf = (found.locus or {}).get("leaf")
    if leaf is None:  # errors spread over many elements: nothing located to build on
        return found
    found.pattern = probed_pattern(prober, direction, leaf, found)
    others = [_argument_error(prober, direction, j, names, notes) for j in range(len(names)) if j != leaf]
    found.others = sorted((o for o in others if o is not None), key=lambda o: -o.ratio())
    return found


def _restricted(direction, low, high):
    part = torch.zeros_like(direction)
    part[low:high] = direction[low:high]
    return part


def _argument_error(prober, direction, j, names, notes):
    """The worst element of argument ``j``'s gradient, from a probe over that argument alone, or None."""
    low, high = prober.evaluator.offsets[j], prober.evaluator.offsets[j + 1]
    if high == low:
        return None
    probe = prober.probe(_restricted(direction, low, high))
    if abs(probe.residual) <= prober.atol:
        return None
    probe.measure_noise(prober)
    tolerance = prober.atol + NOISE_FACTOR * probe.noise
    if abs(probe.residual) <= tolerance:
        return None
    if probe.at_kink(tolerance):
        if notes is not None:
            notes.add_probe(f"`{names[j]}`", probe.left, probe.right, probe.analytical)
        return None
    found = _locate(prober, probe, names, tolerance, notes, low, high)
    if (found.locus or {}).get("leaf") is not None:
        found.pattern = probed_pattern(prober, direction, j, found)
    return found


class _Probe:
    """One direction: analytical ``g . d`` against central (and one-sided) differences."""

    def __init__(self, direction, analytical, central, right, left):
        self.direction, self.analytical = direction, analytical
        self.central, self.right, self.left = central, right, left
        self.residual = analytical - central
        self.noise = 0.0
        self.half = None  # (central, right, left) at eps / 2

    def finite(self):
        return math.isfinite(self.central) and math.isfinite(self.right) and math.isfinite(self.left)

    def measure_noise(self, prober):
        self.half = prober.differences(self.direction, prober.eps / 2)
        self.noise = abs(self.central - self.half[0])
        if self.noise != self.noise:  # NaN: the op is not finite around the point; judge by atol alone
            self.noise = 0.0

    def at_kink(self, tolerance):
        """Both step sizes bracket the analytical value, and the one-sided gap does not shrink with the step.

        A smooth op's one-sided gap is curvature times the step, so halving
        the step halves it; at a kink it stays.
        """
        central, right, left = self.half
        gap, half_gap = abs(self.right - self.left), abs(right - left)
        bracketed = all(min(r, l) - tolerance <= self.analytical <= max(r, l) + tolerance
                        for r, l in ((self.right, self.left), (right, left)))
        return bracketed and gap > 2 * tolerance and half_gap > 0.75 * gap


class _Prober:
    def __init__(self, evaluator, f0, cotangents, g, eps, atol, rtol):
        self.evaluator, self.f0, self.cotangents, self.g, self.eps = evaluator, f0, cotangents, g, eps
        self.atol, self.rtol = atol, rtol
        self.count = 0

    def differences(self, direction, eps, evaluated=None):
        """Central, right and left differences of <v, fn> along ``direction``. ``evaluated(sign)``: fn at
        ``leaves + sign * eps * direction``, evaluated already."""
        self.count += 1
        v = self.cotangents
        if evaluated is None:
            step = (eps * direction).to(self.evaluator.dtype)
            evaluated = lambda sign: self.evaluator.at_flat(step if sign > 0 else step.neg_())  # noqa: E731
        right = projected_difference(v, evaluated(1), self.f0) / eps
        left = projected_difference(v, self.f0, evaluated(-1)) / eps
        return (right + left) / 2, right, left

    def with_step(self, eps):
        return _Prober(self.evaluator, self.f0, self.cotangents, self.g, eps, self.atol, self.rtol)

    def stays_finite(self, direction):
        """Whether the outputs stay finite moved by the step along ``direction``, both ways."""
        step = (self.eps * direction).to(self.evaluator.dtype)
        return all(bool(out.isfinite().all()) for sign in (1, -1)
                   for out in self.evaluator.at_flat(step if sign > 0 else -step) if out.is_floating_point())

    def probe(self, direction, evaluated=None):
        central, right, left = self.differences(direction, self.eps, evaluated)
        return _Probe(direction, float(self.g @ direction), central, right, left)

    def tolerance(self, probe):
        """``probe``'s tolerance: atol plus ``NOISE_FACTOR`` times its measured finite-difference error."""
        probe.measure_noise(self)
        return self.atol + NOISE_FACTOR * probe.noise

    def residual_on(self, direction, start, stop):
        part = torch.zeros_like(direction)
        part[start:stop] = direction[start:stop]
        return self.probe(part).residual


def _magnitude(value):
    return float("inf") if value != value else abs(value)


def _locate(prober, probe, names, tolerance, notes, start_at=0, stop_at=None):
    """The wrong element behind a disagreeing probe: a ramp guess, confirmed, else bisection.

    ``start_at``/``stop_at``: the stretch of the flat index space the probe moved (one argument's, or all).
    """
    n, d = prober.evaluator.numel, probe.direction
    stop_at = n if stop_at is None else stop_at
    start = prober.count
    found = _confirmed(prober, _ramp_guesses(prober, d, probe.residual, low=start_at, high=stop_at), names, notes)
    if found is None:
        low, high, residual = start_at, stop_at, probe.residual
        while high - low > 1:
            middle = (low + high) // 2
            left = prober.residual_on(d, low, middle)
            right = residual - left
            if _magnitude(left) >= _magnitude(right):
                high, residual = middle, left
            else:
                low, residual = middle, right
        found = _element_error(prober, low, names, notes)
    if found is not None:
        return _located(found, prober.count - start, n)
    moved = [name for name, a, b in zip(names, prober.evaluator.offsets[:-1], prober.evaluator.offsets[1:])
             if a < stop_at and b > start_at]
    return DerivativeError(
        output="all outputs", argument=", ".join(moved), element="g . d for a random direction d over every element",
        expected=probe.central, got=probe.analytical, abs_error=_magnitude(probe.residual), tolerance=tolerance,
        strategy=f"{PROBES} random directions over all {n} elements, tolerance atol + {NOISE_FACTOR:g} x the measured "
                 "finite-difference error; no single element explains the disagreement (errors spread over many)",
        argument_grad_all_zero=False, numerical_nonzero=probe.central != 0,
        locus={"cotangents": _copies(prober.cotangents), "leaf": None,
               "direction": [part.clone() for part in prober.evaluator.split(d.to(prober.evaluator.dtype))]},
    )


def _copies(tensors):
    return [None if t is None else t.detach().clone() for t in tensors]


def _located(found, probes, n):
    found.strategy = (f"{PROBES} random directions over all {n} elements; element located in {probes} more probes, "
                      f"tolerance atol + rtol * |numerical| + {NOISE_FACTOR:g} x its measured finite-difference error")
    return found


def _confirmed(prober, guesses, names, notes):
    """The first guess confirmed wrong by a probe of that element alone, trying the first and the last guess."""
    guesses = list(_first_and_last(guesses))
    for guess in guesses:
        found = _element_error(prober, guess, names, notes)
        if found is not None:
            return found
    return None


def _first_and_last(iterator):
    first = last = None
    for item in iterator:
        if first is None:
            first = item
            yield item
        last = item
    if last is not None and last != first:
        yield last


def _ramp_guesses(prober, direction, residual, rounds=4, low=0, high=None):
    """Where a single wrong element sits, from probes weighted by a ramp over a shrinking window.

    With one wrong element i, the residual along ``direction * w`` is
    ``w_i`` times the full residual, so ``w_i`` (hence i) is read off their
    ratio; finite-difference noise limits the precision to a window, which
    the next ramp, over that window only, resolves. A wrong guess is caught
    by the confirmation that follows.
    """
    if residual != residual or residual == 0:
        return
    high = prober.evaluator.numel if high is None else high
    first, last = low, high
    for _ in range(rounds):
        width = high - low
        ramp = torch.zeros_like(direction)
        ramp[low:high] = torch.arange(1, width + 1, dtype=direction.dtype, device=direction.device) / width
        ratio = prober.probe(direction * ramp).residual / residual
        if ratio != ratio or not 0 < ratio < 1.5:
            return
        guess = min(max(low + int(round(ratio * width)) - 1, low), high - 1)
        yield guess
        if width <= 64:
            return
        half = max(8, int(width * 2e-3))
        low, high = max(first, guess - half), min(last, guess + half + 1)


def _element_error(prober, flat, names, notes):
    """A DerivativeError for element ``flat`` of the gradient if it disagrees alone (kinks are noted), else None.

    Judged as the exhaustive path judges an element (atol + rtol * |numerical|),
    plus its own finite-difference error measured with half the step.
    """
    evaluator = prober.evaluator
    unit = torch.zeros(evaluator.numel, dtype=torch.float64, device=evaluator.device)
    unit[flat] = 1.0
    central, right, left = prober.differences(unit, prober.eps)
    got = float(prober.g[flat])
    error = abs(got - central) if got == got else float("inf")
    tolerance = prober.atol + prober.rtol * abs(central)
    if error <= tolerance:
        return None
    noise = abs(central - prober.differences(unit, prober.eps / 2)[0])
    tolerance += NOISE_FACTOR * (noise if noise == noise else 0.0)
    if error <= tolerance:
        return None
    j, index = evaluator.leaf_of(flat)
    as_tensor = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    if bool(kink_mask(as_tensor(central), as_tensor(right), as_tensor(left), as_tensor(got), tolerance, 0.0)[0]):
        if notes is not None:
            notes.add(1, f"grad {names[j]}{fmt_index(index)}", left, right, got)
        return None
    a, b = evaluator.offsets[j], evaluator.offsets[j + 1]
    return DerivativeError(
        output="all outputs", argument=names[j], element=f"grad {names[j]}{fmt_index(index)}",
        expected=central, got=got, abs_error=error, tolerance=tolerance, strategy="",
        argument_grad_all_zero=bool((prober.g[a:b] == 0).all()), numerical_nonzero=central != 0.0,
        locus={"cotangents": _copies(prober.cotangents), "leaf": j, "element": index, "flat": flat},
        at=(j, flat - a),
    )
