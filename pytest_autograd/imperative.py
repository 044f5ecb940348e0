"""The same checks without a marker: ``run_checks`` and the ``autograd_check`` fixture."""

from dataclasses import dataclass

import pytest

from pytest_autograd.case import CORE_OPTIONS, UsageProblem, build_case, normalise_samples
from pytest_autograd.checks.base import CheckContext
from pytest_autograd.runner import device_problem, item_seed, run_check


@dataclass
class Outcome:
    check: str
    device: str
    status: str  # "passed", "failed" or "skipped"
    detail: str = ""


def run_checks(op, *args, reference=None, checks=None, devices=("cpu",), seed=0, registry=None, samples=None,
               **options):
    """Run checks on ``op(*args)`` (or on ``samples``); return Outcomes, never raise on a failed check."""
    if registry is None:
        from pytest_autograd.builtin import pytest_autograd_register_checks
        from pytest_autograd.registry import CheckRegistry

        registry = CheckRegistry()
        pytest_autograd_register_checks(registry)
    known = registry.names()
    names = [checks] if isinstance(checks, str) else list(checks or known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageProblem(f"unknown check(s) {', '.join(map(repr, unknown))}; known checks are: {', '.join(known)}")
    if not callable(op):
        raise UsageProblem(f"op={op!r} is not callable; pass an autograd.Function subclass or a function on tensors")
    allowed = set(CORE_OPTIONS)
    for name in names:
        allowed.update(getattr(registry.get(name), "options", {}) or {})
    allowed -= {"op", "devices"}  # given as run_checks' own arguments
    bad = sorted(set(options) - allowed)
    if bad:
        raise UsageProblem(
            f"unknown option(s) {', '.join(bad)}; known options are: {', '.join(sorted(allowed))}. "
            "To pass keyword arguments to the op, give samples=Sample(*args, **kwargs)."
        )
    from pytest_autograd.case import Sample

    raw = samples if samples is not None else Sample(*args)
    case = build_case({"op": op, "reference": reference, **options}, normalise_samples(raw, "autograd_check"))
    outcomes = []
    for device in devices:
        problem = device_problem(device)
        for name in names:
            check = registry.get(name)
            if problem:
                outcomes.append(Outcome(name, device, "skipped", problem))
                continue
            if not getattr(check, "default", True) and checks is None:
                outcomes.append(Outcome(name, device, "skipped", "opt-in check"))
                continue
            reason = check.applies(case, device)
            if reason:
                outcomes.append(Outcome(name, device, "skipped", reason))
                continue
            check_seed = item_seed(seed, f"{name}-{device}")
            try:
                context = CheckContext(name, case, device, check_seed)
                failure = run_check(check, context, reseed=True)
            except pytest.skip.Exception as skipped:
                outcomes.append(Outcome(name, device, "skipped", str(skipped.msg)))
                continue
            if failure is None:
                outcomes.append(Outcome(name, device, "passed", "\n".join(context.notes)))
            else:
                outcomes.append(Outcome(name, device, "failed", failure.report.render()))
    return outcomes


def fixture_runner(request):
    from pytest_autograd.plugin import REGISTRY, SETTINGS

    settings = request.config.stash[SETTINGS]
    registry = request.config.stash[REGISTRY]

    def autograd_check(op, *args, reference=None, checks=None, devices=None, samples=None, **options):
        problem = None
        try:
            outcomes = run_checks(op, *args, reference=reference, checks=checks or settings.checks,
                                  devices=devices or settings.devices, samples=samples,
                                  seed=item_seed(settings.seed, request.node.nodeid), registry=registry, **options)
        except UsageProblem as raised:
            problem = str(raised)
        if problem is not None:
            if not problem.startswith("autograd_check:"):
                problem = f"autograd_check: {problem}"
            pytest.fail(problem, pytrace=False)
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            body = "\n\n".join(o.detail for o in failed)
            pytest.fail(f"autograd_check: {len(failed)} check(s) failed\n\n{body}\n  rerun: pytest \"{request.node.nodeid}\" "
                        f"--autograd-seed={settings.seed}", pytrace=False)
        return outcomes

    return autograd_check
