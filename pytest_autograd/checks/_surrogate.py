"""Declared surrogate gradients: a backward that is deliberately not the derivative.

A straight-through estimator (forward ``sign``/``round``/a quantiser,
backward passing the gradient through, often only inside a range) has a
true derivative of zero almost everywhere: finite differences can only
disagree with it. ``surrogate_grad=True`` (or a string saying which
surrogate) on the marker makes gradcheck and gradgradcheck skip, saying
so; reference (against a reference with the same surrogate) and the
hygiene checks still run.
"""

from pytest_autograd.engine.outcomes import UsageProblem

OPTION = {"surrogate_grad": None}


def surrogate_reason(case, check):
    """The skip reason when the marker declares a surrogate gradient, else None."""
    declared = case.options.get("surrogate_grad")
    if declared is None or declared is False:
        return None
    if not (declared is True or (isinstance(declared, str) and declared.strip())):
        raise UsageProblem(f"surrogate_grad= must be True or a short description of the surrogate (e.g. "
                           f"'straight-through estimator, 1 inside [-1, 1]'), got {declared!r}.")
    what = "" if declared is True else f" ({declared.strip()})"
    return (f"surrogate_grad= on the marker: backward is a declared surrogate{what}, not the derivative, so {check} "
            "cannot judge it; reference and the hygiene checks still run")


SURROGATE_HINT = ("the output does not move when `{name}` moves (numerical derivative exactly 0) but backward "
                  "passes a gradient: if that is a deliberate surrogate (a straight-through estimator for sign, "
                  "round or a quantiser), declare it with surrogate_grad=True on the marker; otherwise backward "
                  "returns a gradient where there is none")


def looks_like_surrogate(error):
    """A derivative mismatch where the output does not move with the argument at all, yet backward passes a gradient.

    One zero element proves nothing (a linear layer's output row does not
    depend on other input rows): the numerical derivative must be zero over
    the argument's whole Jacobian block.
    """
    return (error.expected == 0.0 and error.got != 0.0 and error.got == error.got  # got == got: not NaN
            and not error.numerical_nonzero)
