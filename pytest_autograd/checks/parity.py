"""parity: each non-CPU device agrees with CPU, the ground truth.

Forward outputs and every input gradient, under one shared random
cotangent, with dtype-aware tolerances; integer outputs exactly. Both runs
are in full float32 (TF32 off, as in every check that does not time the op:
``Check.times_the_op``). An op that does not run on CPU (a Triton or CUDA-only kernel, in its forward or its
backward) has nothing to compare with: skipped, saying why, once its run on
the device has gone through.
"""

import torch

from pytest_autograd.checks._pairs import compare_runs
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.device_faults import first_line
from pytest_autograd.engine.devices import devices_option
from pytest_autograd.engine.execution import grads_of
from pytest_autograd.engine.outcomes import OpRaised, skip


class Parity(Check):
    name = "parity"
    random_draws_differ = "the CPU's and the GPU's generators give different numbers from one seed"
    description = "outputs and gradients on each non-CPU device match the CPU run"

    def applies(self, case, device):
        if device.split(":")[0] == "cpu":
            if any(not d.startswith("cpu") for d in _requested_devices(case)):
                return "CPU is the ground truth here: the items of the other devices compare against it"
            return "parity compares a non-CPU device against CPU: add one, e.g. --autograd-devices=cpu,cuda"
        return None

    def run(self, context):
        refused = {}
        for index, sample in context.samples():
            refusal = _compare_on_devices(context, sample)
            if refusal is not None:
                refused[index] = refusal
        if refused:
            context.sample_index = None
            why = _by_reason(refused)
            if len(refused) == len(context.case.samples):
                skip(f"the op does not run on cpu ({why}): parity has no CPU run to compare the {context.device} "
                     f"run with; the other checks judge the op on {context.device}")
            context.note(f"parity: samples not compared, the op does not run on cpu there ({why})")


def _compare_on_devices(context, sample):
    """Fails when the device's run differs from the CPU's; the reason when the op does not run on CPU, else None."""
    cpu = context.prepare(sample, device="cpu")
    on_device = context.prepare(sample)
    try:
        cpu_run = context.run_op(cpu)
    except OpRaised as raised:
        context.run_op(on_device)  # an op that raises on the device too fails there, not skipped
        return _first_line(raised)
    try:
        compare_runs(context, (cpu, cpu_run), (on_device, context.run_op(on_device)), expected_label="cpu",
                     got_label=context.device, roles=("op", "op"))
    except OpRaised:  # a backward raised: the CPU's (no ground truth to compare with) or the device's (its failure)
        refused = _backward_raises(context, cpu)
        if refused is None:
            raise
        _backward_raises(context, on_device, reraise=True)
        return _first_line(refused)
    return None


def _backward_raises(context, prepared, reraise=False):
    """The OpRaised of a forward and backward of the op on ``prepared`` (raised when ``reraise``), else None."""
    outputs = context.run_op(prepared)
    try:
        grads_of(outputs, prepared.leaves, [torch.ones_like(o) if o.requires_grad else None for o in outputs])
    except OpRaised as raised:
        if reraise:
            raise
        return raised
    return None


def _by_reason(refused):
    """``sample 0: reason; samples 1, 2: other reason`` from {index: reason}."""
    grouped = {}
    for index, reason in refused.items():
        grouped.setdefault(reason, []).append(str(index))
    return "; ".join(f"sample{'s' if len(indices) > 1 else ''} {', '.join(indices)}: {reason}"
                     for reason, indices in grouped.items())


def _first_line(raised, limit=160):
    text = first_line(raised.error)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _requested_devices(case):
    devices = case.options.get("devices")
    if devices:
        return devices_option(devices, "devices=")
    return list(case.run_options.devices) if case.run_options is not None else []


check = Parity()
