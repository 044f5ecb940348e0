"""The pattern of a wrong argument's gradient from probes, for inputs too large for the full Jacobian.

Probing compares the located element alone and random directions over sets
of elements, never the other elements one by one, so a probed pattern
claims only that (``_patterns.Compared(probed=True)``). A set of elements
agrees when a random direction over it agrees: a wrong element moves
``g . d`` by its error times ``|d_i| >= 1`` (see ``_probing``).

* Where: the argument without the located element, then without each slice
  through it (its row, its column), is probed; the wrong elements lie in
  the intersection of the slices whose rest agrees.
* What: a factor holds where it holds at the located element and along a
  random direction over each band of elements of like gradient magnitude
  (``BAND_DECADES`` apart at most). One direction over the whole argument
  lets its largest elements decide: a column whose gradients were 100 times
  the others', twice the numerical one, read as twice along the whole
  argument although every other column was right.
"""

import math

import torch

from pytest_autograd.checks._patterns import (
    FACTOR_RTOL,
    FACTORS,
    SINGLE_MIN_ELEMENTS,
    Compared,
    Pattern,
    as_said,
    worth_naming,
)
from pytest_autograd.checks._slices import element_region, intersection, slices_through

BAND_DECADES = 2  # of gradient magnitude, per band of elements probed together
MAX_BANDS = 6  # the smallest magnitudes beyond these share one band


def probed_pattern(prober, direction, j, found):
    """What argument ``j``'s gradient shows along probes (see the module's docstring), from its located element
    ``found`` and the failing ``direction``; None when no pattern holds."""
    low, high = prober.evaluator.offsets[j], prober.evaluator.offsets[j + 1]
    g = prober.g[low:high]
    if bool((g == 0).all()):
        return None
    shape = tuple(prober.evaluator.base[j].shape)
    part = direction[low:high].clone()
    element = found.locus["flat"] - low
    region = _region(prober, part, low, element, shape)
    inside = None if region is None else region.mask(part.device)
    size = g.numel() if region is None else region.size()
    factor, directions = _factor(prober, part, low, inside, found, size)
    compared = Compared(g.numel(), probed=True, element=found.element, directions=directions)
    if region is None:
        return None if factor is None else Pattern("factor", factor=factor, compared=compared)
    if factor is None and not region.single():
        return None  # wrong somewhere in the slice, how widely unknown: no sign of a slice handled apart
    return Pattern("confined", factor=factor, region=region, element=found.element if region.single() else None,
                   compared=compared)


def _region(prober, part, low, element, shape):
    """The Region the wrong elements lie in: the located element alone, or the slices through it whose rest agrees;
    None when the rest of every one disagrees."""
    if part.numel() < 2:
        return None
    alone = element_region(element, shape)
    if _rest_agrees(prober, part, low, alone.mask(part.device)):
        return alone
    confining = [region for region in slices_through(element, shape)
                 if _rest_agrees(prober, part, low, region.mask(part.device))]
    if len(confining) < 2:
        return confining[0] if confining else None
    # Each slice's rest agreed; the report says the rest of their intersection does, so that is probed as one.
    narrowest = intersection(confining)
    return narrowest if _rest_agrees(prober, part, low, narrowest.mask(part.device)) else confining[0]


def _rest_agrees(prober, part, low, inside):
    rest = part.masked_fill(inside, 0.0)
    return bool((rest != 0).any()) and _within(prober, prober.probe(_placed(prober, rest, low)))


def _within(prober, probe):
    if abs(probe.residual) <= prober.atol:
        return True
    return abs(probe.residual) <= prober.tolerance(probe)


def _factor(prober, part, low, inside, found, size):
    """(the factor at the located element and along every magnitude band of the region, or None; the number of
    directions probed for it)."""
    if found.expected == 0 or not math.isfinite(found.got):
        return None, 0
    fitted = found.got / found.expected  # a factor other than the named ones: the located element's ratio
    fits = worth_naming(fitted) and size >= SINGLE_MIN_ELEMENTS  # any ratio fits a few elements
    candidates = [factor for factor in list(FACTORS) + ([fitted] if fits else [])
                  if abs(found.got - factor * found.expected) <= found.tolerance + FACTOR_RTOL * abs(factor *
                                                                                                   found.expected)]
    if not candidates or size == 1:
        return (as_said(candidates[0]) if candidates else None), 0
    g = prober.g[low:low + part.numel()]
    region = part if inside is None else part.masked_fill(~inside, 0.0)
    # Along the whole region first: most factors that fail, fail there, at the cost of one probe.
    probes = [_measured(prober, region, low)]
    candidates = _holding(candidates, probes)
    bands = _bands(g, inside)
    if candidates and len(bands) > 1:
        by_band = [_measured(prober, part.masked_fill(~band, 0.0), low) for band in bands]
        candidates = _holding(candidates, by_band)
        probes += by_band
    if not candidates or not any(abs(probe.central) > tolerance for probe, tolerance in probes):
        return None, len(probes)  # no factor holds, or no derivative along the probes told from 0
    return as_said(candidates[0]), len(probes)


def _measured(prober, part, low):
    probe = prober.probe(_placed(prober, part, low))
    return probe, prober.tolerance(probe)


def _holding(candidates, probes):
    """The factors of ``candidates`` that every probe shows: analytical ``factor`` times its central difference."""
    return [factor for factor in candidates
            if all(abs(probe.analytical - factor * probe.central) <= tolerance + FACTOR_RTOL * abs(factor * probe.central)
                   for probe, tolerance in probes)]


def _bands(g, inside):
    """Masks of the elements (of ``inside``, or all) whose gradients lie within ``BAND_DECADES`` of each other's
    magnitude, largest first, and the zero ones; beyond ``MAX_BANDS``, the smallest share the last band."""
    inside = torch.ones_like(g, dtype=torch.bool) if inside is None else inside
    magnitude = g.abs()
    zero = inside & (magnitude == 0)
    level = torch.floor(torch.log10(magnitude.clamp_min(1e-300)) / BAND_DECADES)
    levels = sorted({int(v) for v in level[inside & ~zero].unique().tolist()}, reverse=True)
    bands = [inside & ~zero & (level == v) for v in levels[:MAX_BANDS - 1]]
    if len(levels) >= MAX_BANDS:
        bands.append(inside & ~zero & (level <= levels[MAX_BANDS - 1]))
    if bool(zero.any()):
        bands.append(zero)
    return bands


def _placed(prober, part, low):
    """A direction over every element of every argument: ``part`` at the argument starting at ``low``, 0 elsewhere."""
    whole = torch.zeros(prober.evaluator.numel, dtype=part.dtype, device=part.device)
    whole[low:low + part.numel()] = part
    return whole
