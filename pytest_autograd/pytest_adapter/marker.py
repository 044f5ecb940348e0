"""Validating the autograd_op marker itself, before any torch import (the positional
``autograd_op(SomeFunction)`` form, caught before there is a marker to validate, is :mod:`positional_op`'s)."""

import inspect

from pytest_autograd.engine.case import op_display_name, validate_tolerances
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.naming import did_you_mean


def validate_marker(mark, known_options, known_checks, where):
    """Check the marker's own arguments; raise UsageProblem naming the fix."""
    if mark.args:
        first = mark.args[0]
        raise UsageProblem(
            f"{where}: @pytest.mark.autograd_op takes the op as a keyword argument; "
            f"write @pytest.mark.autograd_op(op={op_display_name(first)}, ...) "
            f"(got {len(mark.args)} positional argument(s))."
        )
    unknown = sorted(set(mark.kwargs) - set(known_options))
    if unknown:
        raise UsageProblem(
            f"{where}: unknown @pytest.mark.autograd_op argument(s) {', '.join(unknown)}"
            f"{did_you_mean(unknown, known_options)}; known arguments are: {', '.join(sorted(known_options))}."
        )
    if "op" not in mark.kwargs or mark.kwargs["op"] is None:
        raise UsageProblem(f"{where}: @pytest.mark.autograd_op needs op=..., the Function or callable to check.")
    op = mark.kwargs["op"]
    if _is_function_instance(op):
        raise UsageProblem(
            f"{where}: op={type(op).__name__}() is an instance; pass the autograd.Function class itself: "
            f"op={type(op).__name__}."
        )
    if not callable(op):
        raise UsageProblem(
            f"{where}: op={op!r} is not callable; pass an autograd.Function subclass, "
            "a function on tensors, or a torch.ops / torch.library.custom_op operator."
        )
    reference = mark.kwargs.get("reference")
    if reference is not None and not callable(reference):
        raise UsageProblem(f"{where}: reference={reference!r} is not callable; pass a function with the op's signature.")
    validate_check_names(mark.kwargs, known_checks, where)
    double_backward = mark.kwargs.get("double_backward", True)
    if not isinstance(double_backward, bool):
        raise UsageProblem(f"{where}: double_backward= must be True or False, got {double_backward!r}.")
    validate_tolerances(mark.kwargs, where)


def validate_check_names(kwargs, known_checks, where):
    """``checks=`` and ``skip=`` name known checks; raise UsageProblem naming the closest ones."""
    for option in ("checks", "skip"):
        names = kwargs.get(option)
        if names is None:
            continue
        names = [names] if isinstance(names, str) else list(names)
        bad = [name for name in names if name not in known_checks]
        if bad:
            raise UsageProblem(
                f"{where}: {option}= names unknown check(s) {', '.join(map(repr, bad))}"
                f"{did_you_mean(bad, known_checks)}; "
                f"known checks are: {', '.join(known_checks)}."
            )


def _is_function_instance(op):
    """An instance of an autograd.Function subclass, found without importing torch."""
    return not inspect.isclass(op) and any(
        cls.__name__ == "Function" and cls.__module__.startswith("torch.autograd") for cls in type(op).__mro__
    )
