"""The shape of a wrong argument's gradient over the elements it was measured on: the evidence a hint may name.

One element says little: a worst element that happens to be negated, or
twice its numerical value, is no sign error or constant factor when the
other elements are wrong differently (or right). A pattern is computed over,
and claims, only the elements compared (``Compared``): every element of the
Jacobian block (the full-Jacobian strategy, less those at kinks), or the
located element and random directions over the argument (probing, see
``_probed_patterns``). Where the wrong elements all lie in one slice of the
argument (a column, a row, one element: ``_slices``), the pattern says so,
with the factor over that slice, and that every element outside it is right;
a slice of more than one element is named only where it shows a factor or
each of its elements with a derivative is wrong (two wrong elements that
happen to share a row are no slice handled apart).
"""

import math
from dataclasses import dataclass

from pytest_autograd.checks._slices import common_region

FACTORS = {-1.0: "minus", 2.0: "twice", 0.5: "half", 3.0: "three times", 1 / 3: "a third of"}
FACTOR_RTOL = 1e-3  # how close got / expected must be to a factor, relatively
MIN_FACTOR_GAP = 0.01  # a fitted factor this close to 1 is a rounding difference, not a factor
SINGLE_MIN_ELEMENTS = 4  # "only one element is wrong" needs enough elements for the others to say something


@dataclass
class Compared:
    """The elements of an argument (``total``) a pattern was measured on: ``elements`` of them one by one (the full
    Jacobian; the others sit at a kink, a jump or the domain's edge, judged apart), or, ``probed``, along
    ``directions`` random directions over them, with the located ``element`` measured alone."""

    total: int
    elements: int = None
    probed: bool = False
    element: str = None  # the located element, measured alone (probing)
    directions: int = 0  # random directions over the pattern's part of the argument (probing)

    def every_element(self):
        """Whether every element was compared one by one."""
        return not self.probed and self.elements == self.total


@dataclass
class Pattern:
    """``kind``: "factor" (got = factor x expected at every element compared), "confined" (every wrong element in
    ``region``, every element outside it right; ``factor``: got = factor x expected over the region, or None: then
    a region of several elements has each of its elements with a derivative wrong) or "nonlinear" (backward(-v) is
    not -backward(v))."""

    kind: str
    factor: float = None
    region: object = None  # a _slices.Region, for "confined"
    element: str = None  # the wrong element's label ("grad x[0, 3]"), when the region is one element
    compared: Compared = None
    wrong: int = None  # how many elements of the region are wrong, where each was compared


def factor_of(expected, got, atol):
    """The factor with ``got ~ factor * expected`` at every element (tensors), or None: a named one of FACTORS
    when it is one of them, else the least-squares factor (a scale applied twice, a wrong ``1 / n``)."""
    if expected.numel() == 0 or not bool((expected.abs() > atol).any()):
        return None
    for factor in FACTORS:
        if _scales(expected, got, factor, atol):
            return factor
    if int((expected.abs() > atol).sum()) < SINGLE_MIN_ELEMENTS:
        return None  # any ratio fits a few elements: only a named factor is worth saying there
    fitted = float((got * expected).sum() / (expected * expected).sum())
    if not worth_naming(fitted):
        return None
    return as_said(fitted) if _scales(expected, got, fitted, atol) else None


def worth_naming(factor):
    """A factor a hint may name: finite, not 0 (no gradient, a hint of its own), not a rounding away from 1."""
    return math.isfinite(factor) and factor != 0.0 and abs(factor - 1.0) >= MIN_FACTOR_GAP


def as_said(factor):
    """A factor as the hint says it: a named one of FACTORS as is, any other to three significant digits."""
    return factor if factor in FACTORS else float(f"{factor:.3g}")


def _scales(expected, got, factor, atol):
    return bool(((got - factor * expected).abs() <= atol + FACTOR_RTOL * abs(factor) * expected.abs()).all())


def jacobian_pattern(numerical, analytical, atol, rtol, excluded, element_label, shape):
    """The Pattern of one argument's Jacobian block (rows: every output element, columns: its elements), or None.

    ``excluded`` marks kinks and jumps, judged elsewhere: an element with any
    excluded entry is not counted as compared. ``element_label(column)``
    names a column as a report does; ``shape`` is the argument's.
    """
    judged = ~excluded
    tolerance = atol + rtol * numerical.abs()
    wrong = (((numerical - analytical).abs() > tolerance) | analytical.isnan()) & judged
    if not bool(wrong.any()) or bool((analytical == 0).all()):
        return None  # nothing wrong, or no gradient at all (a hint of its own)
    total = numerical.shape[1]
    compared = Compared(total, elements=total - int(excluded.any(dim=0).sum()))
    factor = factor_of(numerical[judged], analytical[judged], atol)
    if factor is not None:
        return Pattern("factor", factor=factor, compared=compared)
    columns = wrong.any(dim=0)
    region = common_region(columns.nonzero().flatten().tolist(), shape)
    if region is None:
        return None  # spread over the argument, with no factor: no shape to name
    inside = region.mask(columns.device)
    there = numerical[:, inside], analytical[:, inside], judged[:, inside]
    factor = factor_of(there[0][there[2]], there[1][there[2]], atol)
    if factor is None and not region.single() and _some_right(there[0], there[1], columns[inside], atol):
        return None  # a few wrong elements that happen to share a row: no sign of a slice handled apart
    return Pattern("confined", factor=factor, region=region,
                   element=element_label(int(inside.nonzero()[0])) if region.single() else None,
                   compared=compared, wrong=int(columns.sum()))


def _some_right(numerical, analytical, wrong, atol):
    """Whether an element with a derivative (numerical or analytical beyond ``atol``) is right (columns)."""
    moving = ((numerical.abs() > atol) | (analytical.abs() > atol)).any(dim=0)
    return bool((moving & ~wrong).any())


NONLINEAR_HINT = ("backward treats grad_output non-linearly (abs, clamp, sign): gradients must scale with grad_output, "
                  "including negative values")


def mark_nonlinear(found, negated):
    """Give each argument of ``found`` (and its others) that ``negated`` (the -grad_output comparison's error, or
    None) shows not linear in grad_output that pattern."""
    if negated is None:
        return
    nonlinear = {error.argument for error in [negated] + negated.others}
    for error in [found] + found.others:
        if error.argument in nonlinear:
            error.pattern = Pattern("nonlinear")


def describe_factor(factor):
    return FACTORS.get(factor, f"{factor:g}x")
