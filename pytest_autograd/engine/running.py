"""Running one check on one case: RNG isolation, the time budget, and what the check's end means."""

from contextlib import contextmanager

import torch

from pytest_autograd.engine import device_faults, distributed
from pytest_autograd.engine.budget import call_with_limit, time_budget_failure
from pytest_autograd.engine.devices import cuda_devices
from pytest_autograd.engine.float32_math import full_float32
from pytest_autograd.engine.freed_memory import reusing_freed_memory
from pytest_autograd.engine.execution import op_failure
from pytest_autograd.engine.exploration import NotJudged, on_users_sample, whole_checks
from pytest_autograd.engine.outcomes import CheckSkipped, OpRaised
from pytest_autograd.engine.random_draws import FixedDraws, draws_from_global_generator
from pytest_autograd.engine.seeding import seed_torch
from pytest_autograd.engine.triton_interpreter import (
    interpreter_refusal,
    judge_on_a_gpu,
    watching_interpreted_dtypes,
)
from pytest_autograd.engine.torch_noise import quiet_torch_machinery
from pytest_autograd.results.report import CheckFailure, Report


def run_check(check, context, reseed=False):
    """Run ``check`` without disturbing the caller's RNG state; return its CheckFailure or None.

    An op that raised becomes a failure naming the user's frame; a check past
    its time budget (``case.run_options.seconds``), one naming where it was.
    ``reseed`` seeds torch with the context's seed first (the marker path
    seeded it before calling the test body). A check that cannot judge the op
    raises :class:`~pytest_autograd.engine.outcomes.CheckSkipped` through. A
    check that failed in float64 on an op computing in float32 runs again,
    judging it in float32. A GPU fault (``device_faults``) fails the item and every later one on that device.
    A check that explores inputs the user did not give runs whole in the sandbox process
    (``exploration.whole_checks``), every check there with ``isolate="all"``.
    """
    earlier = device_faults.fault_on(context.device)
    if earlier is not None:
        return _not_run_after_fault(check, context, earlier)
    across = distributed.not_judged(check.name, context.case)
    if across:
        raise CheckSkipped(across)
    failure = _judged(check, context, reseed)
    if failure is not None and distributed.world_size(context.case):
        from pytest_autograd.engine.distributed.explain import explain

        explain(failure.report, context.case)
    return failure


def _judged(check, context, reseed):
    if whole_checks.runs_elsewhere(check, context):
        failure = whole_checks.run_check(run_check, check, context, reseed)
        if failure is not whole_checks.RUN_HERE:
            return failure
    notes = len(context.notes)
    failure = _run_once(check, context, reseed)
    if failure is not None and _draws_differ(check, context, failure):
        del context.notes[notes:]  # the failed run's notes are not the verdict's
        failure = _with_fixed_draws(check, context, reseed)
    for _ in context.case.samples:  # each sample found to need float32 once, at most
        if failure is None or not _judged_in_float32_instead(context, failure):
            break
        context.restart()
        failure = _run_once(check, context, reseed)
    return failure


def _draws_differ(check, context, failure):
    """Whether a failure of a check comparing runs that cannot draw alike (``random_draws_differ``) may be the op's
    random draws: the op draws from torch's global generator (see ``engine/random_draws``)."""
    if not getattr(check, "random_draws_differ", None):
        return False
    samples = context.case.samples
    index = failure.report.sample
    indices = [index] if isinstance(index, int) and index < len(samples) else range(len(samples))
    return any(draws_from_global_generator(context, samples[i]) for i in indices)


def _with_fixed_draws(check, context, reseed):
    """The check's verdict with the op's draws from the global generator fixed by position, alike in every run it
    compares; computed afresh (the work other checks shared drew as the op does)."""
    kept = {key: context.case.__dict__.pop(key) for key in SHARED_WORK if key in context.case.__dict__}
    context.restart()
    try:
        with FixedDraws():
            failure = _run_once(check, context, reseed)
    finally:
        context.case.__dict__.update(kept)
    if failure is None:
        context.note(f"{check.name}: the op draws random numbers from torch's global generator, and "
                     f"{check.random_draws_differ}: judged with its draws fixed by each element's position, the "
                     "same numbers in every run")
    return failure


SHARED_WORK = ("_plain_runs", "_reference_runs", "_first_orders")  # runs one check makes for others


def _judged_in_float32_instead(context, failure):
    """After a failure in float64: whether the failing sample was given in a lower dtype and the op computes
    part of it in float32 (see ``float32_blind_plan``). Float64 then cannot judge it: from now on the sample is
    judged in float32, as the sample of an op that refuses float64 is."""
    report = failure.report
    if report.dtype != "float64" or not isinstance(report.sample, int) or report.sample >= len(context.case.samples):
        return False
    from pytest_autograd.checks._float32_blind import float32_instead

    return float32_instead(context, context.case.samples[report.sample]) is not None


def _run_once(check, context, reseed):
    """The check's failure, or None; one found on a sample's first rows (``checks/_fewer_rows``) names them,
    whatever raised it (a check's verdict, the op raising, the time budget, a device fault)."""
    failure = _failure_of(check, context, reseed)
    rows = context.rows_judged.get(failure.report.sample) if failure is not None else None
    if rows is not None:
        failure.report.details.append(rows.detail())
    return failure


def _failure_of(check, context, reseed):
    try:
        with torch.random.fork_rng(devices=cuda_devices(context.device)), quiet_torch_machinery(), \
                watching_interpreted_dtypes() as untrusted, _judging_mode(check, context), \
                device_faults.item_on(context.device), on_users_sample(context, _derivative_order(check)):
            if reseed:
                seed_torch(context.seed)
            expired = call_with_limit(context.case.run_options.seconds, lambda: check.run(context)).expired
        if expired is not None:
            return time_budget_failure(check.name, expired, context.device, context.sample_index)
    except CheckFailure as raised:
        refusal = untrusted(raised.report.dtype)
        if refusal and _looks_like_garbage(raised.report):
            if getattr(check, "explores", False):  # on an input the user did not give: a note (verdicts)
                _note_unjudged(context, check, raised.report, untrusted.why(raised.report.dtype))
                return None
            raise CheckSkipped(refusal) from None
        if refusal:  # sane numbers: a kernel computing in float32 and storing bfloat16 is judged as it is (the
            # exploring checks that compare with a float64 truth have noted such mismatches themselves)
            raised.report.details.append(f"note: {refusal}")
        return raised
    except NotJudged as crashed:  # a variant the op crashed on, and the check had nothing else to judge
        raise CheckSkipped(crashed.reason) from None
    except device_faults.DeviceFault as fault:
        return _fault_failure(check, context, fault.phase, fault.error, fault.situation)
    except RuntimeError as error:  # raised by the check's own code: a kernel's fault reported late, at a later call
        if not device_faults.is_device_fault(error):
            raise
        return _fault_failure(check, context, "a kernel it launched", error)
    except OpRaised as raised:
        refusal = interpreter_refusal(raised.error)
        if refusal:
            raise CheckSkipped(refusal) from None
        failure = op_failure(check.name, raised, context, sample=context.sample_index)
        failure.report.seed = context.seed
        return failure
    return None




def _derivative_order(check):
    """2 for a check that differentiates the op's gradients again: its trial runs take a second backward."""
    return 2 if getattr(check, "differentiates_twice", check.name == "gradgradcheck") else 1


@contextmanager
def _judging_mode(check, context):
    """Full float32 (TF32 off), and on a large CPU sample tensors reusing freed memory, for a check that judges
    the op; the project's own settings for one that times it."""
    if getattr(check, "times_the_op", False):
        yield
        return
    with full_float32(), reusing_freed_memory(_largest_cpu_sample(context)):
        yield


def _largest_cpu_sample(context):
    """Elements of the largest strided CPU tensor among the case's samples; 0 for an item on another device, whose
    large tensors the host's malloc never holds."""
    if str(context.device) != "cpu":
        return 0
    values = (value for sample in context.case.samples for value in sample.values())
    return max((value.numel() for value in values if isinstance(value, torch.Tensor)
                and value.device.type == "cpu" and value.layout == torch.strided), default=0)


def _fault_failure(check, context, phase, error, situation=None):
    from pytest_autograd.engine.case import op_display_name

    device_faults.remember(context.device, f"`{op_display_name(context.case.op)}` faulted it in check {check.name}",
                           error)
    return CheckFailure(Report(
        check=check.name, device=context.device, sample=context.sample_index, seed=context.seed,
        summary=f"the op's {phase} faulted on {context.device}{' ' + situation if situation else ''}: "
                f"{device_faults.first_line(error)}",
        details=[f"{context.device} cannot run anything more in this process after such a fault: its later items "
                 "fail, naming this one"] if device_faults.fault_on(context.device) else [],
        hint=device_faults.LATE_REPORT_HINT))


def _not_run_after_fault(check, context, earlier):
    return CheckFailure(Report(
        check=check.name, device=context.device, sample=None,
        summary=f"not run: {context.device} has been unusable in this process since {earlier}",
        details=["a GPU fault (an illegal memory access, a device-side assert) leaves the device's context broken "
                 "until the process ends"],
        hint="fix the op that faulted first, or run this item alone to judge it: its own verdict is unknown"))


def _note_unjudged(context, check, report, why):
    """An exploring check's failure with the interpreter's garbage in a dtype it computes wrongly, as the note that
    replaces it."""
    from pytest_autograd.engine.exploration.verdicts import Mismatch, not_judged

    dtype = report.dtype
    context.sample_index = report.sample if isinstance(report.sample, int) else None
    context.note(f"{check.name}: " + not_judged(Mismatch(f"in {dtype}", report.summary, dtype), why,
                                                judge_on_a_gpu(dtype)))
    context.sample_index = None


GARBAGE_FACTOR = 1e6  # computed values this many times larger than the expected ones are no kernel's arithmetic


def _looks_like_garbage(report):
    """Whether a failure shows the numbers of broken arithmetic (inf or NaN on one side only, or off by orders of
    magnitude either way) rather than a kernel's mistake: both sides may be the op's own interpreted runs (aliasing,
    noncontiguous). Without the tensors to tell, the failure stands (with the note)."""
    if not report.evidence:
        return False
    for evidence in report.evidence:
        expected, got = evidence.expected, evidence.got
        if bool(torch.isfinite(got).all()) != bool(torch.isfinite(expected).all()):
            return True
        scales = [float(side.abs().max()) if side.numel() else 0.0 for side in (expected, got)]
        if max(scales) > GARBAGE_FACTOR * max(min(scales), 1e-30):
            return True
    return False


__all__ = ["run_check"]
