"""growth: repeated identical calls leave no more live tensors (or device memory) than the first few.

An unbounded cache (``functools.lru_cache`` keyed by tensors, a list on the
Function class that every forward appends to) keeps a few tensors alive per
call. Nothing fails and one call looks clean, but a training run grows until
it is out of memory. The leak check follows the outputs, node, inputs and
``ctx`` attributes of one call; this check counts every tensor created
during many calls.

After one untracked call (the sample's plain run, shared with the other
checks that compare the op with itself: ``_plain_run``), it repeats forward
and backward of all samples ``growth_calls`` times (5 by default), recording
a weak reference to every tensor any aten op creates meanwhile (a
``TorchDispatchMode``) and which call created it. A correct op leaves none
alive once the calls' outputs are dropped. A bounded cache
(``lru_cache(maxsize=4)``) keeps only the last few calls' tensors; an
unbounded one keeps some from every call. So the check fails when every one
of the calls left tensors alive: a cache of fewer entries than
``growth_calls`` passes, and no call has to be run only to let a cache fill.
On CUDA the bytes allocated on the device (``torch.cuda.memory_allocated``)
after the third-last and the last call are compared too. Both measurements
follow one untracked call, so buffers that autograd's CUDA thread still
holds from the last call are not taken for growth.
"""

import gc
import sys
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_autograd.checks._hygiene import cuda_allocated, describe, fmt_bytes
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import grads_of
from pytest_autograd.engine.outcomes import UsageProblem

DEFAULT_CALLS = 5
FEWEST_CALLS = 3  # the device's bytes are compared across the last two calls, after one more that lets a cache fill
SETTLE_PAUSES = (0.0, 0.002, 0.02)  # seconds before each reading of the device's allocated bytes
HINT = ("a cache that grows on every call: bound it (functools.lru_cache(maxsize=...) keyed by shapes, dtypes and "
        "devices, never by tensors, whose hash is their identity so every call adds an entry), or keep per-call "
        "tensors on ctx instead of on the Function class or in a module global")


class CreatedTensors(TorchDispatchMode):
    """Weak references to every tensor an aten op returns while the mode is active, with the call that made it."""

    @classmethod
    def _should_skip_dynamo(cls):
        """torch wraps a mode's ``__torch_dispatch__`` in ``torch._dynamo.disable``, whose first call imports
        dynamo (about a second, nine hundred modules) in a process that never compiles. The wrapping only
        matters where dynamo runs: asked when this class is made, it is done only once dynamo is imported."""
        return "torch._dynamo" in sys.modules

    def __init__(self):
        super().__init__()
        self.refs = []
        self.call = 0  # the call under way, counted from 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_flatten(result)[0]:
            if isinstance(value, torch.Tensor):
                self.refs.append((self.call, weakref.ref(value)))
        return result

    def alive_by_call(self):
        """{call: the distinct tensors it made that are still alive}; a tensor an in-place op returns again in a
        later call is the earliest call's."""
        found, seen = {}, set()
        for call, ref in self.refs:
            tensor = ref()
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                found.setdefault(call, []).append(tensor)
        return found


class Growth(Check):
    name = "growth"
    description = "repeated identical calls do not keep more and more tensors (or device memory) alive"
    options = {"growth_calls": DEFAULT_CALLS}

    def run(self, context):
        calls = _calls(context.case)
        prepared = [context.prepare(sample) for _, sample in context.samples()]
        cotangents = [None] * len(prepared)
        for k, sample in enumerate(prepared):  # a call before the watched ones (the plain run) gives the cotangents
            context.sample_index = k
            cotangents[k] = plain_run(context, k, sample).cotangents
        tracker = CreatedTensors()
        device_bytes = []
        for call in range(1, calls + 1):
            tracker.call = call
            with tracker:
                for k, sample in enumerate(prepared):
                    context.sample_index = k
                    _call_once(context, sample, cotangents[k])
            context.sample_index = None
            if call in (calls - 2, calls):
                device_bytes.append(_settle(context, prepared, cotangents))
        grown_on_device = None if device_bytes[0] is None else max(0, device_bytes[-1] - device_bytes[0])
        if len(tracker.alive_by_call()) < calls and not grown_on_device:
            return  # some call left nothing: a cache that stops growing
        gc.collect()
        survivors = tracker.alive_by_call()
        if len(survivors) < calls and not grown_on_device:
            return  # only Python's cyclic garbage collector frees them: the leak check reports reference cycles
        _report(context, calls, survivors, grown_on_device)


def _settle(context, prepared, cotangents):
    """Let autograd let go of the last tracked call; the device's allocated bytes then (None off CUDA).

    On CUDA, autograd's device thread can still hold the last call's
    gradient buffers when that call returns (a correct linear layer showed
    3 such tensors after every other call), and releases them only when it
    picks up its next task. One untracked call hands it that task, so the
    tracked tensors still alive afterwards are really held. Its own buffers,
    the same for both measurements, cancel out; a few short waits let a
    release in flight finish before the bytes are read.
    Off CUDA, autograd runs backward on the calling thread, which holds
    nothing once the call returns: no call is made.
    """
    if cuda_allocated(context.device) is None:
        return None
    for k, sample in enumerate(prepared):
        _call_once(context, sample, cotangents[k])
    readings = []
    for pause in SETTLE_PAUSES:
        time.sleep(pause)
        gc.collect()
        readings.append(cuda_allocated(context.device))
    return min(readings)


def _calls(case):
    value = case.option("growth_calls", DEFAULT_CALLS)
    if isinstance(value, bool) or not isinstance(value, int) or value < FEWEST_CALLS:
        raise UsageProblem(f"growth_calls= must be an integer of at least {FEWEST_CALLS} (how many identical calls to "
                           f"watch; a cache of fewer entries passes), got {value!r}.")
    return value


def _call_once(context, prepared, cotangents):
    """One forward and backward on fresh copies of the sample; everything it made is dropped on return."""
    outputs = context.run_op(prepared)
    if prepared.leaves and any(out.requires_grad for out in outputs):
        grads_of(outputs, prepared.leaves, cotangents)


def _storage_bytes(tensors):
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once)."""
    storages = {}
    for tensor in tensors:
        try:
            storage = tensor.untyped_storage()
            storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # e.g. sparse tensors
            continue
    return sum(storages.values())


def _report(context, calls, survivors, grown_on_device):
    counts = [len(survivors.get(call, ())) for call in range(1, calls + 1)]
    everything = [tensor for call in sorted(survivors) for tensor in survivors[call]]
    total = _storage_bytes(everything)
    per_call = sum(counts) / calls
    details = [f"tensors still alive after {calls} identical calls, by the call that made them: "
               + ", ".join(str(count) for count in counts),
               f"{len(everything)} tensors, {fmt_bytes(total)} (e.g. "
               f"{', '.join(describe(t) for t in everything[-3:])})",
               "gc.collect() does not free them: something outside the graph (a list, dict or cache on the "
               "Function class or in a module) holds them"]
    noun = "tensor" if per_call == 1 else "tensors"
    summary = (f"every call leaves more tensors alive: {per_call:.3g} {noun} (about {fmt_bytes(int(total / calls))})"
               f" per call, from each of {calls} identical calls")
    if grown_on_device:
        details.insert(0, f"{fmt_bytes(grown_on_device)} more allocated on {context.device} after the last 2 calls "
                          f"({fmt_bytes(grown_on_device // 2)} per call)")
        if len(survivors) < calls:
            summary = (f"every call leaves more memory allocated on {context.device}: about "
                       f"{fmt_bytes(grown_on_device // 2)} per call over the last 2 of {calls} identical calls")
            details = details[:1]
    context.fail(summary, details=details, hint=HINT)


check = Growth()
