"""Hints at the likely cause of a derivative mismatch, from its pattern."""

import math

from pytest_autograd.checks._patterns import NONLINEAR_HINT, pattern_hint


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
    # A sign or a factor is named only when every element of the argument shows it (see _patterns), never
    # from the worst element alone.
    return pattern_hint(error.pattern, error.argument)


def derivative_details(error):
    """One line per other wrong argument, each with its own worst element."""
    return [other.also_line() for other in error.others]
