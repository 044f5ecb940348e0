"""The shape of a wrong argument's gradient over all of its elements: the evidence a hint may name.

One element says little: a worst element that happens to be negated, or
twice its numerical value, is no sign error or constant factor when the
other elements are wrong differently (or right). A hint names a pattern only
when every element of the argument shows it: the whole block of the
Jacobian (full-Jacobian strategy), or the element and a probe over the whole
argument (probing strategy, see ``_probing``).
"""

import math
from dataclasses import dataclass

FACTORS = {-1.0: "minus", 2.0: "twice", 0.5: "half", 3.0: "three times", 1 / 3: "a third of"}
FACTOR_RTOL = 1e-3  # how close got / expected must be to a factor, relatively
MIN_FACTOR_GAP = 0.01  # a fitted factor this close to 1 is a rounding difference, not a factor
SINGLE_MIN_ELEMENTS = 4  # "only one element is wrong" needs enough elements for the others to say something


@dataclass
class Pattern:
    """``kind``: "factor" (got = factor x expected at every element), "single" (one element wrong, the rest right)
    or "nonlinear" (backward(-v) is not -backward(v))."""

    kind: str
    factor: float = None
    element: str = None  # the wrong element, for "single"


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


def jacobian_pattern(numerical, analytical, atol, rtol, excluded, element_label):
    """The Pattern of one argument's Jacobian block (rows: every output element, columns: its elements), or None.

    ``excluded`` marks kinks and jumps, judged elsewhere; ``element_label(column)``
    names a column as a report does.
    """
    judged = ~excluded
    tolerance = atol + rtol * numerical.abs()
    wrong = (((numerical - analytical).abs() > tolerance) | analytical.isnan()) & judged
    if not bool(wrong.any()) or bool((analytical == 0).all()):
        return None  # nothing wrong, or no gradient at all (a hint of its own)
    factor = factor_of(numerical[judged], analytical[judged], atol)
    if factor is not None:
        return Pattern("factor", factor=factor)
    columns = wrong.any(dim=0)
    if int(columns.sum()) == 1 and columns.numel() >= SINGLE_MIN_ELEMENTS:
        return Pattern("single", element=element_label(int(columns.nonzero()[0])))
    return None


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


def pattern_hint(pattern, argument):
    """The hint a Pattern supports, or None."""
    if pattern is None:
        return None
    if pattern.kind == "factor" and pattern.factor == -1.0:
        return f"the analytical gradient has the wrong sign at every element of `{argument}`"
    if pattern.kind == "factor":
        return (f"the analytical gradient is {describe_factor(pattern.factor)} the numerical one at every element "
                f"of `{argument}`: a constant factor is off")
    if pattern.kind == "nonlinear":
        return NONLINEAR_HINT
    if pattern.kind == "single":
        return (f"only {pattern.element} is wrong; every other element of `{argument}`'s gradient matches: an "
                "indexing or boundary slip (the last element, a tile's edge, a loop bound), not the formula")
    return None

