"""``run_checks``: the checks on an op from a script, a notebook or a ``unittest.TestCase``, no pytest needed.

    from pytest_autograd import run_checks, Sample

    outcomes = run_checks(MyLinear, x, w, b, reference=torch.nn.functional.linear, devices=["cpu", "cuda"])
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        print(o.detail)              # the same report the marker prints

It returns one :class:`Outcome` per check and device, and raises only
:class:`~pytest_autograd.engine.outcomes.UsageProblem` for a mistake in the
call (an unknown check, option or device, samples that are not tensors).
"""

import dataclasses
from dataclasses import dataclass, field

from pytest_autograd.checks.base import CheckContext
from pytest_autograd.engine import freed_memory, notes
from pytest_autograd.engine.after_failure import follow_up
from pytest_autograd.engine.budget import DEFAULT_SECONDS
from pytest_autograd.engine.distributed import reason_not_run
from pytest_autograd.engine.builtin import register_builtin_checks
from pytest_autograd.engine.case import (
    CORE_OPTIONS,
    DEFAULT_SHRINK_SECONDS,
    RunOptions,
    Sample,
    build_case,
    normalise_samples,
    validate_tolerances,
)
from pytest_autograd.engine.devices import device_problem, devices_option
from pytest_autograd.engine.outcomes import (
    CheckSkipped,
    UsageProblem,
    pytest_skip_reason,
)
from pytest_autograd.engine.registry import CheckRegistry
from pytest_autograd.engine.running import run_check
from pytest_autograd.engine.seeding import item_seed
from pytest_autograd.results.plots import picture_name

STATUSES = ("passed", "failed", "skipped")


@dataclass
class Outcome:
    """The verdict of one check on one device: ``status`` is passed, failed or skipped; ``detail`` the
    failure report, the skip reason, or a passing check's notes."""

    check: str
    device: str
    status: str
    detail: str = ""
    report: object = field(default=None, repr=False, compare=False)  # a failure's Report (results.report)

    def __str__(self):
        first = self.detail.splitlines()[0] if self.detail else ""
        return f"{self.check}-{self.device}: {self.status}" + (f" ({first})" if first else "")


def run_checks(op, *args, reference=None, checks=None, devices=("cpu",), seed=0, registry=None, samples=None,
               run_options=None, shrink=DEFAULT_SHRINK_SECONDS, repro=None, **options):
    """Run checks on ``op(*args)`` (or on ``samples``); return Outcomes, never raise on a failed check.

    ``checks``: names (default: every default check; opt-in ones such as
    compile are skipped unless named). ``devices``: names or torch.devices.
    ``samples``: a :class:`Sample` or a list of them, for keyword arguments
    or several samples. ``shrink``: seconds a failure's sample may be shrunk
    for (0: off); ``repro``: a directory to write each failure's stand-alone
    script into. Other keywords are the marker's options (atol=,
    double_backward=, constants=, isolate=, ...).
    """
    if registry is None:
        registry = CheckRegistry()
        register_builtin_checks(registry)
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
    validate_tolerances(options, "autograd_check")
    devices = devices_option(devices, "devices=")
    raw = samples if samples is not None else Sample(*args)
    case = build_case({"op": op, "reference": reference, **options}, normalise_samples(raw, "autograd_check"))
    case.shared_seed = item_seed(seed, "shared")
    case.run_options = run_options or RunOptions(seconds=DEFAULT_SECONDS, devices=tuple(devices),
                                                 shrink_seconds=shrink, repro_dir=None if repro is None else str(repro))
    case.run_options = dataclasses.replace(case.run_options, checks=tuple(names))
    outcomes = []
    try:
        for device in devices:
            problem = device_problem(device)
            for name in names:
                outcomes.append(_one(registry.get(name), name, case, device, problem, seed,
                                     explicit=checks is not None))
    finally:
        freed_memory.give_back()
    return outcomes


def _one(check, name, case, device, problem, seed, explicit):
    if problem:
        return Outcome(name, device, "skipped", problem)
    if not getattr(check, "default", True) and not explicit:
        return Outcome(name, device, "skipped", "opt-in check: name it in checks= to run it")
    reason = reason_not_run(check, case, device)
    if reason:
        return Outcome(name, device, "skipped", reason)
    context = CheckContext(name, case, device, item_seed(seed, f"{name}-{device}"))
    first_note = notes.count()  # notes made before this check are not this one's
    try:
        failure = run_check(check, context, reseed=True)
    except CheckSkipped as skipped:
        return Outcome(name, device, "skipped", skipped.reason)
    except BaseException as raised:  # noqa: BLE001 - only a check's own pytest.skip() is an outcome here
        reason = pytest_skip_reason(raised)
        if reason is None:
            raise
        return Outcome(name, device, "skipped", reason)
    if failure is None:
        return Outcome(name, device, "passed", "; ".join(dict.fromkeys(context.notes + notes.since(first_note))))
    position = notes.count()
    follow_up(check, context, failure, picture_name(f"{case.name}-{name}-{device}"))
    notes.forget_since(position)  # the shrinking runs' notes are not this check's
    return Outcome(name, device, "failed", failure.report.render(), failure.report)
