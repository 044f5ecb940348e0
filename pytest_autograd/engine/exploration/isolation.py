"""Trial runs: each new kind of call of the op is run first in the sandbox process.

Before the op runs here on a call it has not met yet (new shapes, strides,
dtype, device, index values, or another variant), the same call runs in the
sandbox (``engine.processes.sandbox``): forward, then backward along random
incoming gradients laid out as the variant lays them out, and a second
backward where the check takes one. A kernel that segfaults, aborts, or
faults its GPU there ends the sandbox, not the session: the call raises
``VariantCrashed`` here instead, and the block that named the variant turns
the crash into its verdict (``crashes``). A call the sandbox ran, or one the
op raised on there, runs here as before: the check judges it.

A kind of call is tried once per case (the items of one test share it), so a
check's thousands of finite-difference calls cost one trial.
"""

import time
from dataclasses import dataclass

from pytest_autograd.engine.exploration import variants
from pytest_autograd.engine.isolate_modes import isolate_mode
from pytest_autograd.engine.exploration.variants import VariantCrashed

TRIAL_SECONDS = 60.0  # a trial run that takes longer is stopped, and counts as hung (within the item's own budget)
SUMMARY_ELEMENTS = 1 << 16  # integer tensors up to this size are told apart by their values, larger ones by a sum
PHASE_MARK = "pytest-autograd trial phase: "


@dataclass
class Trial:
    """How one kind of call went in the sandbox: ``ran`` (or raised: the check sees that here), ``crashed``,
    ``hung`` or ``unavailable`` (the op could not be sent there: ``reason``)."""

    outcome: str
    crash: object = None  # processes.Crash
    fault: str = None  # a GPU fault's message
    phase: str = None  # forward, backward or second backward: where it crashed
    seconds: float = None
    call: str = None  # the call's arguments, described
    reason: str = None
    budget: float = None  # hung: the item's time budget, when that is what it ran out of
    frames: list = None  # hung: where the check called the op here, then where the op was in the sandbox

    @property
    def crashed(self):
        return self.outcome in ("crashed", "hung")


def before_call(case, args, kwargs):
    """Called by ``OpCase.call`` before each call: under an explored variant, the trial run of a new kind of call
    (raising VariantCrashed when it crashed)."""
    found = variants.active()
    if found is None or not found[1].tried or isolate_mode(case) == "off" or _compiling():
        return
    context, variant = found
    trial = trial_of(case, context, variant, args, kwargs)
    if trial.crashed:
        raise VariantCrashed(variant, trial)


def rehearse(context, args, kwargs):
    """The trial of a call the check is about to differentiate along a new kind of incoming gradient on a graph it
    already has (the forward ran, and was tried, with plain ones): raises VariantCrashed when it crashed."""
    before_call(context.case, args, kwargs)


def _compiling():
    """Whether torch.compile is tracing the call: the trial happened before, on the eager call."""
    import torch

    compiler = getattr(torch, "compiler", None)
    return bool(getattr(compiler, "is_compiling", lambda: False)())


def trial_of(case, context, variant, args, kwargs):
    """The Trial of this kind of call, run once per case whatever the variant that made it: a call is as safe as
    its shapes, layouts, dtypes and indices (a crash found earlier is blamed on the variant asking now)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    trials = case.__dict__.setdefault("_trials", {})
    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():  # not the call's own work
        try:
            key = (signature(args, kwargs), getattr(variant.cotangent_layout, "__qualname__", None), variant.order,
                   str(context.device))
        except Exception:  # noqa: BLE001 - wrapped tensors (vmap's, fake ones) have no layout to send: run here
            return Trial("unavailable", reason="the call's tensors are not plain tensors")
        if key not in trials:
            trials[key] = _run_trial(case, context, variant, args, kwargs)
    return trials[key]


def _run_trial(case, context, variant, args, kwargs):
    from pytest_autograd.engine.budget import paused

    with paused() as left:  # the sandbox's start-up is not the op's time; a trial may take what the item has left
        return _trial_within(case, context, variant, args, kwargs, left)


def _trial_within(case, context, variant, args, kwargs, left):
    from pytest_autograd.engine import processes

    seconds = TRIAL_SECONDS if left is None else min(TRIAL_SECONDS, left)
    start = time.perf_counter()
    ways = _ways_to_send(case)
    try:
        for sent in list(ways):
            outcome = processes.sandbox().run(trial_run, sent, args, kwargs, variant.cotangent_layout,
                                              variant.order, context.seed, timeout=seconds)
            if not outcome.unsent:
                break
            ways.remove(sent)  # not this way again
            case.__dict__["_unsendable"] = f"the op cannot be rebuilt in another process: {outcome.raised}"
        else:
            return Trial("unavailable", reason=case.__dict__.get("_unsendable", "the op cannot be sent"))
    except Exception as error:  # noqa: BLE001 - an argument that cannot cross: the call runs here, untried
        return Trial("unavailable", reason=f"an argument cannot be sent to another process ({error})")
    finally:
        _SPENT[0] += time.perf_counter() - start
    took = time.perf_counter() - start
    if outcome.hung is not None:
        import traceback

        return Trial("hung", crash=outcome.crash, phase=_phase(outcome.crash.log), seconds=outcome.hung,
                     call=describe_call(case, args, kwargs),
                     budget=getattr(case.run_options, "seconds", None) if seconds != TRIAL_SECONDS else None,
                     frames=traceback.extract_stack()[:-3] + outcome.crash.frames())
    if outcome.crash is not None:
        return Trial("crashed", crash=outcome.crash, phase=_phase(outcome.crash.last_words), seconds=took,
                     call=describe_call(case, args, kwargs))
    if outcome.fault:
        return Trial("crashed", fault=outcome.raised.message.strip().splitlines()[0],
                     phase=_phase(outcome.raised.traceback_text), seconds=took, call=describe_call(case, args, kwargs))
    return Trial("ran", seconds=took)


_SPENT = [0.0]  # seconds this process has spent on trials


def seconds_in_trials():
    """Seconds spent on trial runs so far: what a check timing the op leaves out of its figure."""
    return _SPENT[0]


def _ways_to_send(case):
    """What may stand for the op in the sandbox, best first (a way the child could not rebuild is dropped): the
    op itself when it pickles (by reference: a class or function of an importable module, a ``torch.ops``
    operator), then its place on the test's marker (the test module, imported there, registers what it needs).
    Empty when nothing can: ``case._unsendable`` says why."""
    ways = case.__dict__.get("_ways_to_send")
    if ways is None:
        from pytest_autograd.engine.processes import transport

        ways = []
        try:
            transport.dumps(case.op)
            ways.append(case.op)
        except Exception as error:  # noqa: BLE001 - a lambda, a local class: found through the marker, if any
            case.__dict__["_unsendable"] = f"the op ({type(case.op).__name__}) cannot be sent to another process: " \
                                           f"{error}"
        if getattr(case, "origin", None) is not None:
            ways.append(case.origin)
        case.__dict__["_ways_to_send"] = ways
    return ways


def trial_run(op, args, kwargs, cotangent_layout, order, seed):
    """In the sandbox: the op's forward, backward along random incoming gradients (laid out by
    ``cotangent_layout``), and a second backward for ``order`` 2; each phase marked in the log first, and
    finished on its device before the next, so a crash is placed in its phase."""
    import torch

    from pytest_autograd.engine.backward_only import autograd_grad
    from pytest_autograd.engine.execution import flatten_outputs

    from pytest_autograd.engine.processes.transport import FromTestMarker

    op = op.resolve() if isinstance(op, FromTestMarker) else op
    torch.manual_seed(seed)
    leaves = [value for value in _tensors((args, kwargs)) if value.requires_grad]
    _mark("forward")
    function = op.apply if isinstance(op, type) and issubclass(op, torch.autograd.Function) else op
    outputs = flatten_outputs(function(*args, **kwargs))  # as OpCase.call calls it
    _finish(outputs)
    moving = [output for output in outputs if output.requires_grad and output.is_floating_point()]
    if not moving or not leaves:
        return None
    cotangents = [_laid(torch.randn_like(output), cotangent_layout) for output in moving]
    _mark("backward")
    grads = autograd_grad(moving, leaves, cotangents, allow_unused=True, create_graph=order > 1)
    _finish(grads)
    if order > 1:
        pairs = [(grad, torch.randn_like(grad)) for grad in grads if grad is not None and grad.requires_grad]
        if pairs:
            _mark("second backward")
            _finish(autograd_grad([g for g, _ in pairs], leaves, [w for _, w in pairs], allow_unused=True))
    return None


def _laid(cotangent, layout):
    laid = layout(cotangent) if layout is not None else None
    return cotangent if laid is None else laid


def _mark(phase):
    import os

    os.write(2, f"\n{PHASE_MARK}{phase}\n".encode())


def _finish(tensors):
    import torch

    devices = {t.device for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
    for device in devices:
        torch.cuda.synchronize(device)


def _phase(text):
    marks = [line[len(PHASE_MARK):].strip() for line in (text or "").splitlines() if line.startswith(PHASE_MARK)]
    return marks[-1] if marks else None


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def signature(args, kwargs):
    """What tells one kind of call from another: each tensor's shape, strides, storage offset, dtype and device,
    integer tensors' values (indices decide where a kernel reads), other values. Not which inputs require grad:
    the first call of a kind decides what its trial differentiates."""
    return tuple(_signature_of(value) for value in list(args) + sorted(kwargs.items(), key=lambda item: item[0]))


def _signature_of(value):
    import torch

    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return ("tensor", str(value.layout), tuple(value.shape), value.dtype, str(value.device))
        facts = (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, str(value.device))
        if value.is_floating_point() or value.is_complex() or value.numel() == 0:
            return facts
        if value.numel() <= SUMMARY_ELEMENTS:
            return facts + (tuple(value.detach().reshape(-1).tolist()),)
        flat = value.detach().reshape(-1).long()
        return facts + (int(flat.min()), int(flat.max()), int(flat.sum()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_signature_of(item) for item in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((key, _signature_of(item)) for key, item in sorted(value.items(), key=str))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


def describe_call(case, args, kwargs):
    """``x: float64 (8, 16), weight: float32 (4, 16) strides (1, 4)``: the call's tensor arguments."""
    import torch

    parts = []
    for slot, value in list(enumerate(args)) + list(kwargs.items()):
        if not isinstance(value, torch.Tensor):
            continue
        text = f"{case.arg_name(slot)}: {str(value.dtype).replace('torch.', '')} {tuple(value.shape)}"
        if value.layout == torch.strided and not value.is_contiguous():
            text += f" strides {value.stride()}"
        if value.layout == torch.strided and value.storage_offset():
            text += f" at storage offset {value.storage_offset()}"
        if not (value.is_floating_point() or value.is_complex()) and 0 < value.numel():
            flat = value.detach().reshape(-1).long()
            text += f" values {int(flat.min())}..{int(flat.max())}"
        parts.append(text)
    return ", ".join(parts)
