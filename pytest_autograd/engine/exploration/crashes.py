"""What a crash in a trial run means: a failure where the op must accept the input, a note where it need not.

A crash on the user's own sample, or on the user's own values in another
valid layout, is the op's: the failure names the op, the check, the variant
and the phase ("`FusedSnake` crashed the process (SIGSEGV) when
`grad_output` is row-strided: its backward reads memory it does not own").
A crash on an input the plugin made up and cannot vouch for (a cut batch that
an index argument may still point into) says nothing sure about the op: the
variant is noted as not judged, with the reason, and the check goes on.
"""

from pytest_autograd.engine.exploration.verdicts import Mismatch, evidence_line, not_judged
from pytest_autograd.results.naming import display_name
from pytest_autograd.results.report import CheckFailure, Report

HOW = "run the op on such an input in a test of its own to see what it does there"
SANDBOX_DETAIL = "it crashed the sandbox process, where pytest-autograd runs what may crash: the session went on"


def meaning(trial):
    """What the crash says the op did, in the words of its kind."""
    phase = trial.phase or "forward or backward"
    if trial.outcome == "hung":
        return f"its {phase} did not return within {trial.seconds:.0f} s"
    if trial.fault is not None:
        return f"its {phase} faulted the GPU ({trial.fault})"
    name = trial.crash.signal_name
    if name in ("SIGSEGV", "SIGBUS"):
        return f"its {phase} reads or writes memory it does not own"
    if name == "SIGABRT":
        return f"its {phase} aborted the process (a failed assertion, or an error its native code did not handle)"
    if name == "SIGFPE":
        return f"its {phase} divided by zero in integer arithmetic"
    return f"its {phase} ended the process"


def how(trial):
    """``crashed the process (SIGSEGV)``, ``faulted its GPU``, ``hung``."""
    if trial.outcome == "hung":
        return "hung"
    if trial.fault is not None:
        return "faulted its GPU"
    return f"crashed the process ({trial.crash.signal_name})"


def failure(context, variant, trial):
    """The CheckFailure for a crash on an input the op must accept; for a call that ran out of the item's time
    budget there, the budget's own failure, naming where the op was."""
    if trial.outcome == "hung" and trial.budget:
        from pytest_autograd.engine.budget import Expired, time_budget_failure

        return time_budget_failure(context.check_name, Expired(trial.budget, trial.frames), context.device,
                                   context.sample_index)
    name = display_name(context.case.op)
    details = ([f"arguments: {trial.call}"] if trial.call else []) + [SANDBOX_DETAIL,
                                                                      evidence_line(variant.evidence)]
    details += _last_words(trial)
    return CheckFailure(Report(
        check=context.check_name, device=context.device, sample=context.sample_index, seed=context.seed,
        summary=f"`{name}` {how(trial)} {variant.situation}: {meaning(trial)}",
        details=details, hint=variant.hint or _hint(trial)))


def note(context, variant, trial):
    """The note for a crash on an input the op need not accept."""
    name = display_name(context.case.op)
    words = _last_words(trial)
    call = f" ({trial.call})" if trial.call else ""
    seen = f"`{name}` {how(trial)} there, in its {trial.phase or 'forward or backward'}{call}" + \
        (f" ({words[0]})" if words else "")
    context.note(f"{variant.check}: " + not_judged(Mismatch(variant.situation, seen), variant.missing or
                                                   "the plugin made that input up", variant.how or HOW))


def _last_words(trial):
    crash = trial.crash
    if crash is None:
        return []
    found = []
    frame = crash.crashed_frame()
    if frame:
        found.append(f"{'waiting at' if trial.outcome == 'hung' else 'crashed at'}: {frame}")
    message = crash.first_message()
    if message:
        found.append(f"its last words: {message}")
    return found


def _hint(trial):
    if trial.outcome == "hung":
        return "a kernel that waits forever (a spin on a flag, a barrier some threads skip) or loops without end"
    return ("run the item alone under a debugger (gdb --args python -m pytest ...), or on a GPU with "
            "CUDA_LAUNCH_BLOCKING=1 under compute-sanitizer, to stop at the access; an index past the end of a "
            "tensor, or a pointer read with the wrong strides or dtype, is the usual cause")
