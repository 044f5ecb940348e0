"""Timing one implementation on one sample: forward, backward alone, and both.

Backward alone replays a retained graph with fixed output gradients, so
no forward is counted; where a graph cannot be replayed, a fresh forward
runs before each call, outside the timed region. Gradients come from
``torch.autograd.grad`` (nothing accumulates into ``.grad``). The op gets its
leaves directly (no clone inside the timed region) unless it writes to its
inputs in place, which the row then says.
"""

from dataclasses import dataclass, field

import torch

from pytest_autograd.bench import roofline
from pytest_autograd.bench.config import DIRECTIONS
from pytest_autograd.bench.measure_info import cpu_count, cpu_name
from pytest_autograd.bench.timers import measure
from pytest_autograd.engine.execution import (
    OpRaised,
    flatten_outputs,
    floating_dtype,
    prepare,
)
from pytest_autograd.engine.outcomes import UsageProblem, raised_by_op
from pytest_autograd.results.compare import dtype_label
from pytest_autograd.results.naming import display_name

FORWARD, BACKWARD, BOTH = DIRECTIONS


@dataclass
class Timing:
    """The measurements of one implementation (the op or the reference) at one point."""

    impl: str  # "op" or "reference"
    name: str
    measurements: dict  # direction -> Measurement
    flops: dict  # direction -> FLOPs per call or None
    bytes: dict  # direction -> bytes per call or None
    notes: list = field(default_factory=list)

    @property
    def forward(self):
        return self.measurements.get(FORWARD)

    @property
    def backward(self):
        return self.measurements.get(BACKWARD)

    @property
    def forward_backward(self):
        return self.measurements.get(BOTH)

    def rates(self, direction):
        """(TFLOP/s, GB/s, FLOP/byte) of ``direction``'s median."""
        measurement = self.measurements.get(direction)
        seconds = measurement.median if measurement else None
        return roofline.rates(self.flops.get(direction), self.bytes.get(direction), seconds)


@dataclass
class BenchResult:
    """What ``autograd_bench`` returns and the check records: op and reference side by side.

    ``result.forward.median``, ``result.backward.noise``, ``result.speedup("forward")``
    (reference time / op time: above 1 the op is faster).
    """

    op: Timing
    reference: Timing = None
    device: str = "cpu"
    dtype: str = None
    size: object = None
    sample: int = 0
    rows: list = field(default_factory=list)

    @property
    def forward(self):
        return self.op.forward

    @property
    def backward(self):
        return self.op.backward

    @property
    def forward_backward(self):
        return self.op.forward_backward

    def speedup(self, direction=FORWARD):
        if self.reference is None:
            return None
        mine, theirs = self.op.measurements.get(direction), self.reference.measurements.get(direction)
        if mine is None or theirs is None or not mine.median:
            return None
        return theirs.median / mine.median

    def regressions(self):
        """Rows that failed ``--autograd-bench-fail`` against the baseline (filled in by the plugin)."""
        return [row for row in self.rows if row.get("regressed")]


def bench_point(case, sample, device, dtype, config, directions, generator):
    """Time the op (and the reference, if any) on ``sample``; returns a BenchResult without rows."""
    impls = [("op", case.name, case.call)]
    if case.reference is not None:
        impls.append(("reference", display_name(case.reference), case.reference))
    cotangent_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    runners = {}
    for impl, name, call in impls:
        try:
            runners[impl] = _Runner(call, prepare(case, sample, device, dtype=dtype), cotangent_seed)
        except OpRaised as raised:
            if impl == "op":
                raise
            raise UsageProblem(f"reference={name} raised {type(raised.error).__name__} on the op's arguments: "
                               f"{raised.error}. The reference must take the same arguments as the op.") from None
    timings = {impl: runners[impl].time(impl, name, directions, config) for impl, name, _ in impls}
    override = case.option("flops")
    if isinstance(override, dict) and {FORWARD, BACKWARD} <= set(override):
        flops = {}  # fully given: no need to count (counting first imports torch._dynamo, ~1 s)
    else:
        # FLOPs from the reference when there is one (its ops are plain torch, so countable).
        flops = runners["reference"].count_flops() if "reference" in runners else None
        if not flops or not any(flops.values()):
            flops = runners["op"].count_flops()
    # Callables see the arguments as timed: on the device, in the benchmarked dtype.
    args, kwargs = runners["op"].prepared.args, runners["op"].prepared.kwargs
    for timing in timings.values():
        timing.flops = roofline.resolve(override, flops, args, kwargs, "flops")
        timing.bytes = roofline.resolve(case.option("bytes"), timing.bytes, args, kwargs, "bytes")
    return BenchResult(timings["op"], timings.get("reference"), device=str(device), dtype=_dtype_label(sample, dtype))


class _Runner:
    """Forward, backward-alone and forward+backward callables for one implementation."""

    def __init__(self, call, prepared, cotangent_seed):
        self.call = call
        self.prepared = prepared
        self.leaves = prepared.leaves
        self.notes = []
        self.clone = False
        args, kwargs = prepared.call_args(clone_leaves=False, copy_mutable=False)
        try:
            outputs = self._outputs(call(*args, **kwargs))
        except RuntimeError as error:
            if "in-place" not in str(error) and "inplace" not in str(error):
                raise raised_by_op("forward", error) from error
            self.clone = True
            self.notes.append("includes cloning the inputs (the op writes to them in place)")
            outputs = self._forward()
        except Exception as error:
            raise raised_by_op("forward", error) from error
        self.args, self.kwargs = args, kwargs
        self.differentiable = [k for k, out in enumerate(outputs)
                               if out.requires_grad and out.is_floating_point()]
        generator = torch.Generator().manual_seed(cotangent_seed)
        self.cotangents = [torch.randn(outputs[k].shape, generator=generator, dtype=torch.float32)
                           .to(device=outputs[k].device, dtype=outputs[k].dtype) for k in self.differentiable]
        self.bytes = roofline.ideal_bytes(
            list(prepared.args) + list(prepared.kwargs.values()), outputs,
            [outputs[k] for k in self.differentiable], self.leaves)

    @staticmethod
    def _outputs(result):
        return flatten_outputs(result)

    def _forward(self):
        args, kwargs = self.prepared.call_args(clone_leaves=self.clone, copy_mutable=self.clone)
        try:
            return flatten_outputs(self.call(*args, **kwargs))
        except Exception as error:
            raise raised_by_op("forward", error) from error

    def forward(self):
        if self.clone:
            return self._forward()
        return self.call(*self.args, **self.kwargs)

    def _grad(self, outputs, retain):
        return torch.autograd.grad([outputs[k] for k in self.differentiable], self.leaves, self.cotangents,
                                   retain_graph=retain, allow_unused=True)

    @property
    def has_backward(self):
        return bool(self.differentiable and self.leaves)

    def count_flops(self):
        backward = (lambda outputs: self._grad(outputs, False)) if self.has_backward else None
        return roofline.count_flops(self._forward, backward)

    def time(self, impl, name, directions, config):
        measurements = {}
        device = self.leaves[0].device if self.leaves else _device_of(self.prepared)
        if FORWARD in directions:
            measurements[FORWARD] = _guarded("forward", measure, self.forward, device, config)
        if self.has_backward and BACKWARD in directions:
            measurements[BACKWARD] = self._time_backward(device, config)
        elif BACKWARD in directions or BOTH in directions:
            self.notes.append("no backward: no output requires grad")
        if self.has_backward and BOTH in directions:
            measurements[BOTH] = _guarded("backward", measure,
                                          lambda: self._grad(flatten_outputs(self.forward()), False), device, config)
        return Timing(impl, name, measurements, {}, self.bytes, list(self.notes))

    def _time_backward(self, device, config):
        outputs = self._forward()
        replay = lambda: self._grad(outputs, True)  # noqa: E731
        try:
            replay()
            replay()
        except Exception as error:
            if "backward through the graph a second time" not in str(error) and "retain" not in str(error):
                raise raised_by_op("backward", error) from error
            self.notes.append("backward timed after a fresh forward per call (its graph cannot be replayed)")
            return _guarded("backward", measure, lambda outs: self._grad(outs, False), device, config,
                            setup=self._forward)
        return _guarded("backward", measure, replay, device, config)


def _guarded(phase, fn, *args, **kwargs):
    """Run a timing; an exception from the op in the middle of it is reported as the op's."""
    try:
        return fn(*args, **kwargs)
    except (OpRaised, UsageProblem):
        raise
    except Exception as error:
        raise raised_by_op(phase, error) from error


def _device_of(prepared):
    for value in list(prepared.args) + list(prepared.kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _dtype_label(sample, dtype):
    dtype = dtype or floating_dtype(sample)
    return None if dtype is None else dtype_label(dtype)


def machine_info(device=None):
    """What a reader needs to judge the numbers: CPU, cores, threads, torch, CUDA and GPU."""
    info = {
        "cpu": cpu_name(),
        "cores": cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info
