"""Running one item of an ``autograd_model`` test: the model once, then one check on every custom op it ran.

The item fails listing every wrong op with its report, and names the
correct ops and the skipped ones, so one wrong op never hides the others'
verdicts. A passing item shows each op's verdict in its report section.
"""

import dataclasses

import pytest

from pytest_autograd.engine.devices import device_problem
from pytest_autograd.engine.model_capture import capture_model
from pytest_autograd.engine.model_options import SCAN_OPTIONS, autocast_check_options
from pytest_autograd.engine.model_sizes import judges_sizes, model_sizes
from pytest_autograd.engine.model_scan import (
    NothingToCheck,
    ScanResult,
    check_ops,
    model_and_calls,
    scan_ops,
)
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.seeding import item_seed, seeded
from pytest_autograd.pytest_adapter.items import (
    NOTES_SECTION,
    call_body,
    fail_usage_problem,
    rerun_command,
    run_options,
    selected_check,
    warn_notes,
)
from pytest_autograd.pytest_adapter.keys import MODEL_MARKER
from pytest_autograd.pytest_adapter.reporting import attach_picture, remember_for_record
from pytest_autograd.pytest_adapter.skipping import skip_here

NOT_CHECK_OPTIONS = ("checks", "skip", "devices", "xfail", *SCAN_OPTIONS)


def run_model_item(item, spec, settings, registry):
    problem = device_problem(spec.device)
    if problem:
        skip_here(problem)
    selected_check(registry, spec)
    seed = item_seed(settings.seed, item.nodeid)
    with seeded(seed):
        result, rerun = _scan(item, spec, settings, registry, seed)
    _report(item, spec, result, rerun, seed)


def _scan(item, spec, settings, registry, seed):
    where = item.nodeid
    options = dict(item.get_closest_marker(MODEL_MARKER).kwargs)
    rerun = rerun_command(item, settings.seed, spec, registry.get(spec.check))
    try:
        model, calls = model_and_calls(call_body(item), where)
        # autocast=: the autocast check judges each op on what the model's step under autocast hands it
        under = options.get("autocast") if spec.check == "autocast" else None
        capture = capture_model(model, calls, seed=seed, autocast=under)
        scanned, notes = scan_ops(capture, options.get("ops"), options.get("skip_ops"))
        remember_for_record(item, seed, rerun)
        sizes = model_sizes(model, calls, capture, seed, run_options(item.config).isolate) \
            if judges_sizes(registry, [spec.check]) else None
        verdicts = check_ops(
            scanned, [spec.check], devices=[spec.device], seed=seed, registry=registry,
            run_options=run_options(item.config), max_signatures=options.get("max_signatures", SCAN_OPTIONS[
                "max_signatures"]), op_options=options.get("op_options"), explicit=True, at_other_sizes=sizes,
            **_check_options(options, spec.check))
        problem = None
    except UsageProblem as raised:
        problem = str(raised)
    except NothingToCheck as nothing:
        skip_here(nothing.reason)
    if problem is not None:
        fail_usage_problem(item, spec, problem)
    return ScanResult(verdicts, capture.backward, notes + (sizes.notes if sizes is not None else [])), rerun


def _check_options(options, check):
    """The marker's options that go to each op's checks; ``autocast=`` has the autocast check judge in its
    dtype."""
    found = {name: value for name, value in options.items() if name not in NOT_CHECK_OPTIONS}
    if options.get("autocast") is not None and check == "autocast":
        return autocast_check_options(found, options["autocast"])
    return found


def _report(item, spec, result, rerun, seed):
    label = f"{spec.check}-{spec.device}"
    if result.wrong:
        for verdict in result.wrong:
            for outcome in verdict.outcomes:
                if outcome.report is not None:
                    attach_picture(outcome.report, item.config, item.nodeid)
        first = result.wrong[0]
        failure = next(o.report for o in first.outcomes if o.status == "failed")
        failed = pytest.fail.Exception(f"{label}: {result.render(brief=True)}\n  rerun: {rerun}", pytrace=False)
        # the first wrong op's structured report, for the JSON record, its summary naming the op
        failed.autograd_report = dataclasses.replace(
            failure, summary=f"`{first.name}` at {first.scanned.site}: {failure.summary}", nodeid=item.nodeid,
            rerun=rerun)
        raise failed
    if not result.passed:
        reasons = "; ".join(f"`{v.name}`: {v.skip_reason()}" for v in result.skipped)
        skip_here(f"{spec.check} judged none of the model's {len(result.verdicts)} custom ops: {reasons}")
    verdicts = [f"{label}: {result.summary()}"] + [v.line() for v in result.verdicts]
    notes = [f"`{v.name}`: {o.detail}" for v in result.verdicts for o in v.outcomes if o.status == "passed" and o.detail]
    notes += [f"`{v.name}`: {n}" for v in result.verdicts for c in v.checked for n in c.notes]
    notes = list(dict.fromkeys(notes + result.all_notes()))
    item.add_report_section("call", NOTES_SECTION, "\n".join(verdicts + [f"note: {n}" for n in notes]))
    item.user_properties.extend(("autograd_note", text) for text in notes)  # the checks' own notes, in the summary
    if notes:
        warn_notes(item, notes)  # where the summary's footer says notes are: the warnings summary
