"""growth: repeated identical calls leave no more live tensors (or device memory) than the first few.

An unbounded cache (``functools.lru_cache`` keyed by tensors, a list on the
Function class that every forward appends to) keeps a few tensors alive per
call. Nothing fails and one call looks clean, but a training run grows until
it is out of memory. The leak check follows the outputs, node, inputs and
``ctx`` attributes of one call; this check counts every tensor created
during many calls.

After one untracked call (the sample's plain run, shared with the other
checks that compare the op with itself: ``_plain_run``), it repeats forward
and backward of all samples ``growth_calls`` times (8 by default), recording
a weak reference to every tensor any aten op creates meanwhile (a
``TorchDispatchMode``), and counts after each call how many are still alive
once the call's outputs are dropped. A correct op leaves none; a bounded
cache (``lru_cache(maxsize=4)``) fills up during the first half of the calls
and then stops growing, which passes. Growth during the second half fails,
with tensors and bytes per call. On CUDA the bytes allocated on the device
(``torch.cuda.memory_allocated``) are compared too. Both measurements follow
one untracked call, so buffers that autograd's CUDA thread still holds from
the last call are not taken for growth.

On a sample of over 16k elements the calls are made on its first rows, each
row whole (``_fewer_rows``): a cache grows per call, not per row, and eight
calls of a large sample would cost eight of gradcheck's forwards and
backwards.
"""

import gc
import time
import weakref

import torch
from torch.utils._pytree import tree_flatten

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import cuda_allocated, describe, fmt_bytes
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.dispatch_mode import DispatchMode
from pytest_autograd.engine.execution import grads_of
from pytest_autograd.engine.outcomes import UsageProblem

DEFAULT_CALLS = 8
SETTLE_PAUSES = (0.0, 0.002, 0.02)  # seconds before each reading of the device's allocated bytes
HINT = ("a cache that grows on every call: bound it (functools.lru_cache(maxsize=...) keyed by shapes, dtypes and "
        "devices, never by tensors, whose hash is their identity so every call adds an entry), or keep per-call "
        "tensors on ctx instead of on the Function class or in a module global")


class CreatedTensors(DispatchMode):
    """Weak references to every tensor an aten op returns while the mode is active."""

    def __init__(self):
        super().__init__()
        self.refs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_flatten(result)[0]:
            if isinstance(value, torch.Tensor):
                self.refs.append(weakref.ref(value))
        return result

    def alive(self):
        """The distinct tensors still alive (an in-place op returns its input again: counted once)."""
        found = {}
        for ref in self.refs:
            tensor = ref()
            if tensor is not None:
                found[id(tensor)] = tensor
        return list(found.values())


class Growth(Check):
    name = "growth"
    description = "repeated identical calls do not keep more and more tensors (or device memory) alive"
    options = {"growth_calls": DEFAULT_CALLS}

    def run(self, context):
        calls = _calls(context.case)
        prepared, cotangents, cut = [], [], []
        for index, sample in context.samples():  # a call before the watched ones gives the cotangents
            prepared.append(context.prepare(judged_sample(context, index, sample)))
            cotangents.append(plain_run(context, index, prepared[-1]).cotangents)
            if index in context.rows_judged:
                cut.append(f"sample {index}: {context.rows_judged[index].detail()}")
        tracker = CreatedTensors()
        counts, device_bytes, host_bytes = [], [], []
        half = calls // 2
        for call in range(calls):
            with tracker:
                for k, sample in enumerate(prepared):
                    context.sample_index = k
                    _call_once(context, sample, cotangents[k])
            context.sample_index = None
            measured = call in (half - 1, calls - 1)
            if measured:
                device_bytes.append(_settle(context, prepared, cotangents))
            alive = tracker.alive()
            counts.append(len(alive))
            if measured:
                host_bytes.append(_storage_bytes(alive))
            del alive
        grown = counts[-1] - counts[half - 1]
        grown_on_device = None if device_bytes[0] is None else max(0, device_bytes[1] - device_bytes[0])
        if grown <= 0 and not grown_on_device:
            return
        gc.collect()
        survivors = tracker.alive()
        if len(survivors) <= counts[half - 1] and not grown_on_device:
            return  # only Python's cyclic garbage collector frees them: the leak check reports reference cycles
        _report(context, counts, half, survivors, host_bytes[1] - host_bytes[0], grown_on_device, calls, cut)


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
    if isinstance(value, bool) or not isinstance(value, int) or value < 4:
        raise UsageProblem(f"growth_calls= must be an integer of at least 4 (how many identical calls to watch; "
                           f"growth in the second half fails), got {value!r}.")
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


def _report(context, counts, half, survivors, grown_bytes, grown_on_device, calls, cut):
    window = calls - half
    grown = counts[-1] - counts[half - 1]
    total = _storage_bytes(survivors)
    per_call = grown / window
    per_call_bytes = max(0, grown_bytes) / window
    details = [f"tensors created during the calls still alive after call 1..{calls}: "
               + ", ".join(str(count) for count in counts),
               f"still alive after the last call: {len(survivors)} tensors, {fmt_bytes(total)} "
               f"(e.g. {', '.join(describe(t) for t in survivors[-3:])})",
               "gc.collect() does not free them: something outside the graph (a list, dict or cache on the "
               "Function class or in a module) holds them"] + cut
    noun = "tensor" if per_call == 1 else "tensors"
    summary = (f"every call leaves more tensors alive: {per_call:.3g} {noun} (about {fmt_bytes(int(per_call_bytes))})"
               f" per call over the last {window} of {calls} identical calls")
    if grown_on_device:
        details.insert(0, f"{fmt_bytes(grown_on_device)} more allocated on {context.device} after the last "
                          f"{window} calls ({fmt_bytes(grown_on_device // window)} per call)")
        if grown <= 0:
            summary = (f"every call leaves more memory allocated on {context.device}: about "
                       f"{fmt_bytes(grown_on_device // window)} per call over the last {window} of {calls} "
                       "identical calls")
    context.fail(summary, details=details, hint=HINT)


check = Growth()
