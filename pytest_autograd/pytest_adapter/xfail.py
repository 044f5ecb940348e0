"""``xfail=`` on the marker: expected failures of single checks.

``xfail={"gradgradcheck": "double backward is not implemented yet"}`` (or a
name or list of names, with a generic reason) marks only those checks' items
``xfail``; the other checks of the test run as usual. pytest's ``xfail``
semantics apply unchanged, ``xfail_strict`` included: under it an xfailed
check that passes fails the run (XPASS(strict)), and the checks not named
are never affected.
"""

import pytest

from pytest_autograd.engine.outcomes import UsageProblem

OPTION = "xfail"
DEFAULT_REASON = "expected to fail (xfail= on the autograd_op marker)"


def xfail_reasons(value, known_checks, where):
    """{check name: reason} from the marker's ``xfail=``; raise UsageProblem naming the fix."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = {value: DEFAULT_REASON}
    elif isinstance(value, (list, tuple, set, frozenset)):
        value = {name: DEFAULT_REASON for name in value}
    elif not isinstance(value, dict):
        raise UsageProblem(f"{where}: xfail= must map check names to reasons, e.g. "
                           f"xfail={{'gradgradcheck': 'why it fails'}}, got {value!r}.")
    bad = [name for name in value if name not in known_checks]
    if bad:
        from pytest_autograd.pytest_adapter.marker import did_you_mean

        raise UsageProblem(f"{where}: xfail= names unknown check(s) {', '.join(map(repr, bad))}"
                           f"{did_you_mean([str(name) for name in bad], known_checks)}; "
                           f"known checks are: {', '.join(known_checks)}.")
    not_text = [name for name, reason in value.items() if not isinstance(reason, str)]
    if not_text:
        raise UsageProblem(f"{where}: xfail= reason for {not_text[0]!r} must be a string saying why the check "
                           f"is expected to fail, got {value[not_text[0]]!r}.")
    return dict(value)


def item_param(spec, item_id, reasons):
    """The parametrize entry of one item: marked xfail when its check is expected to fail."""
    reason = reasons.get(spec.check)
    if reason is None:
        return pytest.param(spec, id=item_id)
    return pytest.param(spec, id=item_id, marks=pytest.mark.xfail(reason=reason))
