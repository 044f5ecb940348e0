"""Running one generated item: device, seed, samples, applies, run, report."""

import pytest
import torch

from pytest_autograd import root_cause
from pytest_autograd.budget import call_with_limit, item_seconds, time_budget_failure
from pytest_autograd.case import UsageProblem, build_case, normalise_samples
from pytest_autograd.checks.base import CheckContext
from pytest_autograd.execution import OpRaised, op_failure
from pytest_autograd.modules import with_parameters
from pytest_autograd.notes import record_notes
from pytest_autograd.report import CheckFailure
from pytest_autograd.reporting import attach_picture, remember_for_record
from pytest_autograd.rerun import pytest_command
from pytest_autograd.sample_values import validate_sample_values
from pytest_autograd.seeding import item_seed, seeded
from pytest_autograd.torch_noise import quiet_torch_machinery

MARKER = "autograd_op"


def device_problem(device):
    """None when ``device`` can run here, else why not."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    backend = getattr(torch, kind, None)
    if kind == "mps":
        available = torch.backends.mps.is_available()
        count = 1 if available else 0
    elif backend is not None and hasattr(backend, "is_available"):
        available = backend.is_available()
        count = backend.device_count() if available and hasattr(backend, "device_count") else int(available)
    else:
        return f"this torch build has no {kind!r} backend"
    if not available:
        built = ""
        if kind == "cuda":
            built = f" (torch {torch.__version__} is built {'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'})"
        return f"device {device!r} was asked for but {kind.upper()} is not available{built}"
    if index and int(index) >= count:
        return f"device {device!r} was asked for but only {count} {kind} device(s) exist"
    return None


def skip_here(reason):
    """Skip the item, reported at the test's location rather than inside the plugin."""
    try:
        raise pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword: a plain skip
        pytest.skip(reason)


def rerun_command(item, base_seed, spec=None, check=None):
    """A command that regenerates this very item: same node id, same seed.

    A non-CPU item only exists when its device is asked for, and an opt-in
    check only runs when selected, so those options are part of the command.
    """
    options = [f"--autograd-seed={base_seed}"]
    if spec is not None and spec.device.split(":")[0] != "cpu":
        options.append(f"--autograd-devices={spec.device}")
    if spec is not None and check is not None and not getattr(check, "default", True):
        options.append(f"--autograd-checks={spec.check}")
    return pytest_command(item.config, item.nodeid, *options)


def call_body(item, **overrides):
    names = item._fixtureinfo.argnames
    return item.obj(**{**{name: item.funcargs[name] for name in names}, **overrides})


def run_item(item, spec, settings, registry):
    problem = device_problem(spec.device)
    if problem:
        skip_here(problem)
    check = registry.get(spec.check)
    if not getattr(check, "default", True) and not spec.selected:
        skip_here(f"{spec.check} is opt-in: select it with --autograd-checks={spec.check} or checks=[...] on the marker")
    seed = item_seed(settings.seed, item.nodeid)
    with seeded(seed):
        _run_seeded(item, spec, settings, check, seed)


def _run_seeded(item, spec, settings, check, seed):
    where = item.nodeid
    try:
        case = _build_case(item, marker_of(item, spec), spec, where)
        reason = check.applies(case, spec.device)
        if reason:
            skip_here(reason)
        rerun = rerun_command(item, settings.seed, spec, check)
        remember_for_record(item, seed, rerun)
        context = CheckContext(check.name, case, spec.device, seed)
        failure = run_check(check, context)
        record_notes(item, context.notes)
        problem = None
    except UsageProblem as raised:
        problem = str(raised)
    if problem is not None:
        headline = problem.replace(f"{where}: ", "")
        pointer = root_cause.pointer_to_first(item, spec, root_cause.cause_of_usage_problem(problem, where), headline)
        pytest.fail(pointer or problem, pytrace=False)
    if failure is not None:
        summary = failure.report.summary
        pointer = root_cause.pointer_to_first(item, spec, root_cause.cause_of_failure(summary), summary)
        if pointer:
            pytest.fail(pointer, pytrace=False)
        attach_picture(failure.report, case.config, where)
        _fail(failure, rerun, where, seed)


def marker_of(item, spec):
    """The autograd_op marker this item checks (a test may carry several)."""
    marks = list(item.iter_markers(MARKER))
    index = getattr(spec, "marker", 0)
    return marks[index] if index < len(marks) else marks[0]


def _build_case(item, mark, spec, where):
    """The OpCase from the test body, with the samples the hooks adjust for this device."""
    samples = normalise_samples(call_body(item), where)
    case = build_case(mark.kwargs, samples, where)
    case.config = item.config
    case.factory = lambda **overrides: with_parameters(case.op, normalise_samples(call_body(item, **overrides), where))
    for adjusted in item.config.hook.pytest_autograd_adjust_samples(case=case, device=spec.device):
        if adjusted is not None:
            case.samples = with_parameters(case.op, normalise_samples(adjusted, where))
            validate_sample_values(case, where)
            break
    return case


def run_check(check, context, reseed=False):
    """Run ``check`` without disturbing the caller's RNG state; return its CheckFailure or None.

    An op that raised becomes a failure naming the user's frame; an item past
    its time budget (``budget``), one naming where it was. ``reseed``
    seeds torch with the context's seed first (the marker path seeded it
    before calling the test body).
    """
    try:
        with torch.random.fork_rng(devices=cuda_devices(context.device)), quiet_torch_machinery():
            if reseed:
                torch.manual_seed(context.seed)
            expired = call_with_limit(item_seconds(context.case.config), lambda: check.run(context)).expired
        if expired is not None:
            return time_budget_failure(check.name, expired, context.device, context.sample_index)
    except CheckFailure as raised:
        return raised
    except OpRaised as raised:
        failure = op_failure(check.name, raised, context, sample=context.sample_index)
        failure.report.seed = context.seed
        return failure
    return None


def cuda_devices(device):
    """The CUDA device indices whose RNG state fork_rng must save for ``device``."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return [torch.device(device).index or 0]
    return []


def _fail(failure, rerun, nodeid, seed=None):
    report = failure.report
    if report.seed is None:
        report.seed = seed
    report.rerun = report.rerun or rerun
    report.nodeid = nodeid
    failed = pytest.fail.Exception(report.render(), pytrace=False)
    failed.autograd_report = report  # the structured fields, for the JSON record
    raise failed


__all__ = ["run_item", "run_check", "cuda_devices", "device_problem"]
