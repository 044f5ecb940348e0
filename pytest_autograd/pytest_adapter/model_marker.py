"""Validating the ``autograd_model`` marker at collection, before any model runs."""

from pytest_autograd.engine.model_options import NOT_PER_OP, validate_scan_options
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.pytest_adapter.keys import MARKER, MODEL_MARKER
from pytest_autograd.pytest_adapter.marker import validate_check_names

BODY = "the test body returns the model and its inputs: `return model, (x,)`"


def validate_model_marker(marks, op_marks, known_options, known_checks, where):
    """The test's one ``autograd_model`` marker and its options; raise UsageProblem naming the fix."""
    if op_marks:
        raise UsageProblem(f"{where}: a test carries @pytest.mark.{MARKER} (one op, the body returns its samples) or "
                           f"@pytest.mark.{MODEL_MARKER} (a model, {BODY}), not both; split it into two tests.")
    if len(marks) > 1:
        raise UsageProblem(f"{where}: the test carries {len(marks)} @pytest.mark.{MODEL_MARKER} markers (one may come "
                           "from its class or module); give it one, with every option in it.")
    mark = marks[0]
    if mark.args:
        raise UsageProblem(f"{where}: @pytest.mark.{MODEL_MARKER} takes keyword options only (ops=, skip_ops=, "
                           f"checks=, ...); {BODY}. Got {len(mark.args)} positional argument(s).")
    validate_check_names(mark.kwargs, known_checks, where)
    validate_scan_options(mark.kwargs, where, set(known_options) - set(NOT_PER_OP) - {"xfail"})
