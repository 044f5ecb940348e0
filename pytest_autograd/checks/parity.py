"""parity: each non-CPU device agrees with CPU, the ground truth.

Forward outputs and every input gradient, under one shared random
cotangent, with dtype-aware tolerances; integer outputs exactly.
"""

from pytest_autograd.checks._pairs import compare_runs
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.devices import devices_option


class Parity(Check):
    name = "parity"
    description = "outputs and gradients on each non-CPU device match the CPU run"

    def applies(self, case, device):
        if device.split(":")[0] == "cpu":
            if any(not d.startswith("cpu") for d in _requested_devices(case)):
                return "CPU is the ground truth here: the items of the other devices compare against it"
            return "parity compares a non-CPU device against CPU: add one, e.g. --autograd-devices=cpu,cuda"
        return None

    def run(self, context):
        for index, sample in context.samples():
            cpu = context.prepare(sample, device="cpu")
            on_device = context.prepare(sample)
            compare_runs(
                context,
                (cpu, context.run_op(cpu)),
                (on_device, context.run_op(on_device)),
                expected_label="cpu",
                got_label=context.device,
                roles=("op", "op"),
            )


def _requested_devices(case):
    devices = case.options.get("devices")
    if devices:
        return devices_option(devices, "devices=")
    return list(case.run_options.devices) if case.run_options is not None else []


check = Parity()
