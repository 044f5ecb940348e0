"""A whole check run in the sandbox: the checks that explore inputs the user did not give (and, with
``isolate="all"``, every check).

The sandbox rebuilds the case from what can cross (the op and reference by
reference, or by their place on the test's marker; the samples by value),
keeps it while the items of one test come (they share their work there as
they do here) and runs the check on it. Each variant the check opens is
marked in the sandbox's log as it starts and ends. When the sandbox crashes,
the innermost open variant is the one that crashed it: the check runs again
in a new sandbox that knows it, and meets the crash as that variant's
verdict (``crashes``: a failure where the op must accept the input, a note
where it need not) instead of running it; the other variants run as usual.
A crash outside any variant is a crash on the user's own sample. A variant
that ``narrows`` runs once more after its crash, so that the check tries its
parts one by one (each argument laid out alone, then grad_output alone) and
the failure names the one that crashes.
"""

import dataclasses
import itertools
import os

from pytest_autograd.engine.exploration import USERS_SAMPLE, crashes
from pytest_autograd.engine.isolate_modes import isolate_mode
from pytest_autograd.engine.exploration.isolation import Trial
from pytest_autograd.engine.exploration.variants import Variant, innermost_open

RUN_HERE = object()  # what ``run_check`` returns when the check must run in the session's process after all
MAX_CRASHES = 8  # runs of one check a sandbox may crash before its remaining variants are left unjudged
SLACK_SECONDS = 30.0  # past the check's own budget, the sandbox is stopped as hung
KEPT_CASES = 4  # cases a sandbox keeps for the items still to come
_TOKENS = itertools.count(1)


def runs_elsewhere(check, context):
    """Whether ``check`` runs whole in the sandbox for this case: ``isolate`` is "explore" and the check explores
    inputs the user did not give, or it is "all"; never when the case cannot be sent (the note says why)."""
    mode = isolate_mode(context.case)
    if mode not in ("explore", "all") or (mode == "explore" and not getattr(check, "explores", False)):
        return False
    return portable_case(context.case) is not None


def run_check(run, check, context, reseed):
    """The check's failure (or None), as ``run`` (``engine.running.run_check``, which the sandbox imports) gives
    it, computed in the sandbox; raises CheckSkipped or UsageProblem as the check did there."""
    from pytest_autograd.engine import notes, processes
    from pytest_autograd.engine.outcomes import CheckSkipped, UsageProblem

    case = context.case
    known = {}  # Variant.key() -> the Trial of a crash there, for the runs after it
    budget = getattr(case.run_options, "seconds", None)
    for _ in range(MAX_CRASHES + 1):
        worker = processes.sandbox()
        outcome = worker.run(_check_here, *_task(run, check, context, worker, known, reseed),
                             timeout=budget + SLACK_SECONDS if budget else None)
        if outcome.returned and outcome.value[0] == "resend":
            case.__dict__.pop("_sent_to", None)
            outcome = worker.run(_check_here, *_task(run, check, context, worker, known, reseed),
                                 timeout=budget + SLACK_SECONDS if budget else None)
        if outcome.returned:
            kind, payload, made_notes, broken = outcome.value
            if broken:  # its GPU faulted: the next item needs a new sandbox
                worker.stop()
            for text in made_notes:
                if text not in context.notes:
                    context.notes.append(text)
                    notes.note(text)
            if kind == "skipped":
                raise CheckSkipped(payload)
            if kind == "usage":
                raise UsageProblem(payload)
            return payload
        if outcome.raised is not None:  # the sandbox could not rebuild the case (or a plugin bug): run it here
            case.__dict__["_not_portable"] = f"the sandbox could not rebuild it ({outcome.raised})"
            return RUN_HERE
        trial = _trial(outcome)
        variant, sample = innermost_open(outcome.crash.log if outcome.crash is not None else "")
        narrowed = variant is not None and variant.narrows and variant.key() in known
        if variant is None or (variant.evidence and (not variant.narrows or narrowed)) or variant.key() in known:
            context.sample_index = sample
            return crashes.failure(context, variant if variant is not None and variant.evidence else
                                   _users_sample(context), trial)
        known[variant.key()] = trial
    context.note(f"{check.name}: the sandbox crashed {MAX_CRASHES + 1} times; the variants left were not judged")
    return None


def _task(run, check, context, worker, known, reseed):
    """The arguments of ``_check_here``: the case crosses once per sandbox (then only its token)."""
    case = context.case
    sent_to = (id(worker), worker.starts)
    token = case.__dict__.setdefault("_sandbox_token", next(_TOKENS))
    portable = None if case.__dict__.get("_sent_to") == sent_to else portable_case(case)
    case.__dict__["_sent_to"] = sent_to
    return (run, check, token, portable, str(context.device), context.seed, context.check_name, known, reseed,
            _settings())


def warm(modules):
    """In the sandbox, before its first task: import what running checks there needs, and ``modules`` (the test
    modules of the session: they import the ops, build their extensions, register their torch.ops)."""
    import importlib

    from pytest_autograd.engine.builtin import builtin_check_names
    from pytest_autograd.engine.processes import transport

    importlib.import_module("pytest_autograd.engine.running")
    for name in builtin_check_names():
        importlib.import_module(f"pytest_autograd.checks.{name}")
    for module in modules:
        try:
            transport.import_module(module)
        except BaseException:  # noqa: BLE001 - a test module that cannot be imported here: the task says so later
            continue


def _settings():
    """What the session's process has set that a check's verdict may depend on: environment variables, torch's
    default dtype and deterministic mode."""
    import torch

    return (dict(os.environ), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def portable_case(case):
    """A copy of ``case`` that can cross to the sandbox (its op and reference as themselves, else as their place on
    the test's marker; none of the work checks keep on it), or None when it cannot (``_not_portable`` says why)."""
    if "_not_portable" in case.__dict__:
        return None
    from pytest_autograd.engine.processes import transport

    changes = {"factory": None, "run_options": dataclasses.replace(case.run_options, bench=None, isolate="off")
               if case.run_options is not None else None}
    for field, keyword in (("op", "op"), ("reference", "reference")):
        value = getattr(case, field)
        if not _crosses(value, transport):
            if case.origin is None:
                case.__dict__["_not_portable"] = f"its {field} cannot be sent to another process"
                return None
            changes[field] = case.origin.with_keyword(keyword)
    options = {}
    for name, value in case.options.items():
        options[name] = value if _crosses(value, transport) else (
            case.origin.with_keyword(name) if case.origin is not None else None)
    options["isolate"] = "off"  # the sandbox runs it there and then
    changes["options"] = options
    portable = dataclasses.replace(case, **changes)
    try:
        transport.dumps(portable)
    except Exception as error:  # noqa: BLE001 - a sample value that cannot cross
        case.__dict__["_not_portable"] = f"it cannot be sent to another process ({error})"
        return None
    return portable


def _crosses(value, transport):
    try:
        transport.dumps(value)
        return True
    except Exception:  # noqa: BLE001 - a lambda, a local class
        return False


def _check_here(run_check, check, token, portable, device, seed, check_name, known, reseed, settings):
    """In the sandbox: run the check on the case of ``token``, as ``engine.running.run_check`` would here.
    Returns (kind, payload, notes, whether the device is broken now) or ("resend",) when the case is not kept."""
    import torch

    from pytest_autograd.checks.base import CheckContext
    from pytest_autograd.engine import device_faults, notes
    from pytest_autograd.engine.exploration import variants
    from pytest_autograd.engine.outcomes import CheckSkipped, UsageProblem

    case = _kept(token, portable)
    if case is None:
        return ("resend",)
    environment, default_dtype, deterministic, warn_only = settings
    os.environ.clear()
    os.environ.update(environment)
    torch.set_default_dtype(default_dtype)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    variants.MARKING = True
    variants.KNOWN_CRASHES.clear()
    variants.KNOWN_CRASHES.update(known)
    device_faults.forget_all()
    notes.take()
    context = CheckContext(check_name, case, device, seed)
    kind = "passed"
    try:
        payload = run_check(check, context, reseed=True)
        kind = "failure" if payload is not None else "passed"
    except CheckSkipped as skipped:
        kind, payload = "skipped", skipped.reason
    except UsageProblem as problem:
        kind, payload = "usage", str(problem)
    finally:
        variants.KNOWN_CRASHES.clear()
    broken = device_faults.fault_on(device) is not None
    if kind == "failure" and broken:  # this process is what the fault broke, not the session's
        payload.report.details = [line for line in payload.report.details if "cannot run anything more" not in line]
    return kind, payload, list(dict.fromkeys(context.notes + notes.take())), broken


_CASES = {}  # in the sandbox: token -> the case rebuilt from it, the latest last


def _kept(token, portable):
    if portable is not None:
        _CASES.pop(token, None)
        _CASES[token] = _resolved(portable)
        while len(_CASES) > KEPT_CASES:
            del _CASES[next(iter(_CASES))]
    return _CASES.get(token)


def _resolved(case):
    from pytest_autograd.engine.processes.transport import FromTestMarker

    def resolve(value):
        return value.resolve() if isinstance(value, FromTestMarker) else value

    case.op, case.reference = resolve(case.op), resolve(case.reference)
    case.options = {name: resolve(value) for name, value in case.options.items()}
    return case


def _trial(outcome):
    from pytest_autograd.engine.processes import Crash

    if outcome.hung is not None:
        return Trial("hung", crash=outcome.crash, seconds=outcome.hung, phase=phase_of(outcome.crash))
    if outcome.crash is None:
        return Trial("crashed", crash=Crash(None, ""))
    return Trial("crashed", crash=outcome.crash, phase=phase_of(outcome.crash))


def phase_of(crash):
    """forward or backward: the first of them among the crashed thread's Python frames, innermost first."""
    for line in crash.last_words.splitlines():
        text = line.strip()
        if text.startswith("File ") and " in " in text:
            name = text.rsplit(" in ", 1)[1]
            if "backward" in name:
                return "backward"
            if "forward" in name:
                return "forward"
    return None


def _users_sample(context):
    return Variant(context.check_name, "on your sample", evidence=(USERS_SAMPLE,))


def _raised_there(raised):
    from pytest_autograd.engine.outcomes import UsageProblem

    raise UsageProblem(f"the check raised in the sandbox: {raised}\n{raised.traceback_text}")
