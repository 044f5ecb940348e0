"""Running one generated item: device, seed, samples, applies, run, report."""

import zlib

import pytest
import torch

from pytest_autograd.case import UsageProblem, build_case, normalise_samples
from pytest_autograd.checks.base import CheckContext
from pytest_autograd.execution import OpRaised, op_failure
from pytest_autograd.report import CheckFailure

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


def item_seed(base_seed, nodeid):
    return zlib.crc32(f"{base_seed}:{nodeid}".encode()) & 0x7FFFFFFF


def rerun_command(item, base_seed, spec=None, check=None):
    """A command that regenerates this very item: same node id, same seed.

    A non-CPU item only exists when its device is asked for, and an opt-in
    check only runs when selected, so those options are part of the command.
    """
    command = f"pytest {item.nodeid!r} --autograd-seed={base_seed}".replace("'", '"')
    if spec is not None and spec.device.split(":")[0] != "cpu":
        command += f" --autograd-devices={spec.device}"
    if spec is not None and check is not None and not getattr(check, "default", True):
        command += f" --autograd-checks={spec.check}"
    return command


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
    torch.manual_seed(seed)
    mark = item.get_closest_marker(MARKER)
    where = item.nodeid
    try:
        case = _build_case_once_per_test(item, mark, spec, where)
        reason = check.applies(case, spec.device)
        if reason:
            skip_here(reason)
        notes = execute(check, case, spec.device, seed, rerun_command(item, settings.seed, spec, check), where)
        item.user_properties.extend(("autograd_note", note) for note in notes)
        problem = None
    except UsageProblem as raised:
        problem = str(raised)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


SAMPLE_PROBLEMS = pytest.StashKey()


def _build_case_once_per_test(item, mark, spec, where):
    """The OpCase from the test body; a body that gives no usable samples fails one item only.

    The other items of the same test are skipped pointing at that failure,
    instead of repeating it once per check and device.
    """
    problems = item.config.stash.setdefault(SAMPLE_PROBLEMS, {})
    params = {k: v for k, v in item.callspec.params.items() if not k.startswith("_autograd")}
    key = (item.parent.nodeid if item.parent else "", item.originalname, repr(sorted(params.items(), key=str)))
    if key in problems:
        skip_here(f"the test body's samples are unusable: see the failure of {problems[key]}")
    try:
        samples = normalise_samples(call_body(item), where)
        case = build_case(mark.kwargs, samples)
    except UsageProblem:
        problems[key] = item.nodeid
        raise
    case.config = item.config
    case.factory = lambda **overrides: normalise_samples(call_body(item, **overrides), where)
    for adjusted in item.config.hook.pytest_autograd_adjust_samples(case=case, device=spec.device):
        if adjusted is not None:
            case.samples = normalise_samples(adjusted, where)
            break
    return case


def execute(check, case, device, seed, rerun=None, nodeid=None):
    """Run ``check``; turn failures into a rendered pytest failure; return the check's notes."""
    context = CheckContext(check.name, case, device, seed)
    failure = run_check(check, context)
    if failure is not None:
        _fail(failure, rerun, nodeid, seed)
    return context.notes


def run_check(check, context, reseed=False):
    """Run ``check`` without disturbing the caller's RNG state; return its CheckFailure or None.

    An op that raised becomes a failure naming the user's frame. ``reseed``
    seeds torch with the context's seed first (the marker path seeded it
    before calling the test body).
    """
    try:
        with torch.random.fork_rng(devices=cuda_devices(context.device)):
            if reseed:
                torch.manual_seed(context.seed)
            check.run(context)
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
    pytest.fail(report.render(), pytrace=False)


__all__ = ["run_item", "execute", "run_check", "cuda_devices", "device_problem"]
