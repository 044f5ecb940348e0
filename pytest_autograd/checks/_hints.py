"""Hints at the likely cause of a derivative mismatch, from its pattern.

A pattern hint says where the pattern was measured: "at every element" only
when every element was compared one by one (the full Jacobian), else the
elements compared, or the random directions it was measured along (probing);
a pattern confined to a slice names the slice and says the rest is right.
"""

import math

from pytest_autograd.checks._patterns import NONLINEAR_HINT, SINGLE_MIN_ELEMENTS, describe_factor
from pytest_autograd.results.report import Hint

ELEMENT_CAUSE = "an indexing or boundary slip (the last element, a tile's edge, a loop bound), not the formula"
SLICE_CAUSE = ("an index, stride or bound that treats this slice apart (a special-cased first or last row or "
               "column, a remainder block, a tile's edge), not the formula")


def derivative_hint(error, has_backward=True):
    expected, got = error.expected, error.got
    if error.argument_grad_all_zero and error.numerical_nonzero and not has_backward:
        return (f"autograd sees no dependence of the output on `{error.argument}`: the op computes it outside "
                "the graph (.detach(), .data, .item(), numpy, or a kernel without autograd support); "
                f"if `{error.argument}` is a constant, declare it: constants=('{error.argument}',) on the marker")
    if error.argument_grad_all_zero and error.numerical_nonzero:
        return (f"backward returns no gradient (None or zeros) for `{error.argument}` although the output "
                "depends on it: check the order of the gradients backward returns and ctx.needs_input_grad indexing; "
                f"if `{error.argument}` is a constant, declare it: constants=('{error.argument}',) on the marker")
    if "not linear in grad_output" in error.strategy:
        return NONLINEAR_HINT
    if "kink element moved together" in error.strategy:
        return ("the gradients of tied elements add up to more (or less) than the derivative along them: a tie rule "
                "that gives every tied element the full gradient; share it (divide by the number of ties) or give "
                "it to one of them")
    if not math.isfinite(got) and math.isfinite(expected):
        return ("backward produced inf/NaN where the numerical derivative is finite: sqrt, pow or log of a saved "
                "value at 0 (d sqrt(y)/dy is inf there), or the torch.where gradient trap (the discarded branch's "
                "NaN gradient times 0 is still NaN); make the unsafe input safe before the op")
    # A sign or a factor is named only when every element compared shows it (see _patterns), never from the worst
    # element alone.
    return pattern_hint(error.pattern, error.argument)


def pattern_hint(pattern, argument):
    """The hint a Pattern supports (a results.report.Hint, whose cause is its factor), or None."""
    if pattern is None:
        return None
    if pattern.kind == "nonlinear":
        return NONLINEAR_HINT
    cause = None if pattern.factor is None else describe_factor(pattern.factor)
    if pattern.kind == "factor":
        return Hint(_everywhere(pattern, argument), cause=cause, confined=False)
    if pattern.kind == "confined":
        text = _one_element(pattern, argument) if pattern.region.single() else _one_slice(pattern, argument)
        return Hint(text, cause=cause, confined=True)
    return None


def _everywhere(pattern, argument):
    compared = pattern.compared
    if compared.every_element():
        over = f"at every element of `{argument}`"
    elif compared.probed and not compared.directions:
        over = f"at {compared.element}, the only element of `{argument}`"
    elif compared.probed:
        over = f"at {compared.element} and {_along(compared.directions)} over all {compared.total} elements of " \
               f"`{argument}`"
    else:
        over = f"at the {compared.elements} elements of `{argument}` compared ({_left_out(compared)})"
    if pattern.factor == -1.0:
        return f"the analytical gradient has the wrong sign {over}"
    return f"the analytical gradient is {describe_factor(pattern.factor)} the numerical one {over}: a constant " \
           "factor is off"


def _one_element(pattern, argument):
    compared, element = pattern.compared, pattern.element
    if compared.probed:
        rest = f"a random direction over the other {compared.total - 1} elements of `{argument}` matches"
    elif compared.every_element():
        rest = f"every other element of `{argument}`'s gradient matches"
    else:
        rest = f"the other {compared.elements - 1} elements of `{argument}` compared match ({_left_out(compared)})"
    if compared.total < SINGLE_MIN_ELEMENTS:  # too few others to tell a slip from a formula: what was seen, only
        there = "" if pattern.factor is None else f" ({describe_factor(pattern.factor)} the numerical one there)"
        return f"the analytical gradient is wrong only at {element}{there}; {rest}"
    if compared.probed:
        return f"only {element} is wrong: it fails alone, and {rest}: {ELEMENT_CAUSE}"
    return f"only {element} is wrong; {rest}: {ELEMENT_CAUSE}"


def _one_slice(pattern, argument):
    compared, region = pattern.compared, pattern.region
    where, size = region.describe(argument), region.size()
    factor = None if pattern.factor is None else f"{describe_factor(pattern.factor)} the numerical one there"
    if compared.probed:  # a probed slice is named only with its factor (see _probed_patterns)
        there = f"{factor} (at {compared.element} and {_along(compared.directions)} over its {size} elements)"
        rest = f"right along a random direction over the other {compared.total - size} elements"
    else:  # without a factor, a slice is named only when each of its elements that has a derivative is wrong
        there = factor or (f"all {size} of its elements wrong" if pattern.wrong == size else
                           f"all {pattern.wrong} of its elements that have a derivative wrong (the other "
                           f"{size - pattern.wrong} have none)")
        rest = "right at every other element" if compared.every_element() else \
            f"right at every other element compared ({_left_out(compared)})"
    return f"the analytical gradient is wrong only in {where}: {there}, {rest}: {SLICE_CAUSE}"


def _along(directions):
    return "along a random direction" if directions == 1 else f"along {directions} random directions"


def _left_out(compared):
    left = compared.total - compared.elements
    return f"{left} more at a kink, a jump or the domain's edge {'is' if left == 1 else 'are'} judged apart"


def derivative_details(error):
    """One line per other wrong argument, each with its own worst element."""
    return [other.also_line() for other in error.others]
