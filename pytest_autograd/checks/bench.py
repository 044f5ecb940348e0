"""bench: time forward, backward alone and both, against the reference, with roofline figures.

Opt-in with ``--autograd-bench`` so that normal runs stay fast. A
regression against ``--autograd-bench-compare`` fails this item with the
old and new times, their ratio and noise; the timings themselves go to the
session table, JSON and baselines through the bench plugin.
"""

import torch

from pytest_autograd.bench import config as bench_config
from pytest_autograd.bench.config import BadSetting
from pytest_autograd.bench.measure import bench_point, machine_info
from pytest_autograd.bench.results import BaselineProblem, make_rows
from pytest_autograd.bench.state import OFF_REASON, stable_nodeid, sweep_parameter
from pytest_autograd.checks._transforms import forward_and_backward
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.outcomes import UsageProblem, skip
from pytest_autograd.engine.triton_interpreter import interpreted_kernels_reason


class Bench(Check):
    name = "bench"
    description = "times forward, backward and both (and the reference's), with TFLOP/s and GB/s; --autograd-bench"
    times_the_op = True  # in the math mode the project chose (TF32 where it allows it), with its malloc settings
    options = {
        "flops": None,  # FLOPs per call: number (forward), {direction: n}, or callable(*sample) -> either
        "bytes": None,  # bytes moved per call, same forms
        "sweep": None,  # sizes, e.g. [256, 1024, 4096], passed to the test body's size parameter
        "sweep_arg": None,  # the parameter receiving the size (default: the first with a default)
        "bench_budget": None,  # seconds per timing, overrides --autograd-bench-budget
        "bench_noise": None,  # noise target, overrides --autograd-bench-noise
        "bench_cache": None,  # "cold" or "warm" (CUDA L2)
        "bench_dtypes": None,  # e.g. ["float32", "bfloat16"]: cast floating inputs; default the sample's
        "bench_samples": None,  # which samples to time: index, list or "all" (default: the first)
        "bench_directions": None,  # subset of forward, backward, forward+backward
    }

    def applies(self, case, device):
        state = case.run_options.bench if case.run_options is not None else None
        if state is None:
            return "benchmarks run under pytest with --autograd-bench (or use the autograd_bench fixture)"
        if not state.enabled:
            return OFF_REASON
        return None

    def run(self, context):
        case = context.case
        refusal = interpreted_kernels_reason(lambda: forward_and_backward(context, case.samples[0], None))
        if refusal:
            skip(refusal)
        state = case.run_options.bench
        item = state.current_item
        where = item.nodeid if item is not None else case.name
        try:
            timer = state.timer.with_options(case.option("bench_budget"), case.option("bench_noise"),
                                             case.option("bench_cache"), where=where)
            directions = bench_config.parse_directions(case.option("bench_directions"), where)
            dtypes = _dtypes(case.option("bench_dtypes"), where)
            points = self._points(case, item, where)
        except BadSetting as problem:
            raise UsageProblem(str(problem)) from None
        machine = machine_info(context.device)
        test = stable_nodeid(item) if item is not None else case.name
        test_name = item.name if item is not None else case.name
        regressions = []
        for size, samples in points:
            try:
                indices = bench_config.parse_samples(case.option("bench_samples"), len(samples), where)
            except BadSetting as problem:
                raise UsageProblem(str(problem)) from None
            for index in indices:
                context.sample_index = index
                for dtype in dtypes:
                    try:
                        result = bench_point(case, samples[index], context.device, dtype, timer, directions,
                                             context.generator)
                    except BadSetting as problem:
                        raise UsageProblem(f"{where}: {problem}") from None
                    result.size, result.sample = size, index
                    rows = make_rows(result, test, test_name, size=size, sample=index)
                    result.rows = rows
                    try:
                        for line in state.compare_rows(rows):
                            regressions.append(f"{result.op.name} {line}")
                    except BaselineProblem as problem:
                        raise UsageProblem(str(problem)) from None
                    state.record(item, rows, machine)
        context.sample_index = None
        if regressions:
            rules = ", ".join(rule.describe() for rule in state.fail_rules)
            context.fail(
                f"{len(regressions)} timing(s) regressed against baseline {state.compare!r} (limit {rules})",
                details=regressions,
                hint=f"if the slowdown is expected, save a new baseline with --autograd-bench-save={state.compare}",
            )

    @staticmethod
    def _points(case, item, where):
        """(size, samples) pairs, made one at a time (a large size's tensors only while it is timed)."""
        sweep = case.option("sweep")
        if sweep is None:
            return iter([(None, case.samples)])
        sizes = bench_config.parse_sweep(sweep, where)
        if case.factory is None or item is None:
            raise BadSetting(f"{where}: sweep= needs the test body to rebuild samples; run it under pytest")
        argument = sweep_parameter(item, case.option("sweep_arg"))
        return ((size, case.factory(**{argument: size})) for size in sizes)


def _dtypes(value, where):
    if value is None:
        return [None]
    names = [value] if isinstance(value, (str, torch.dtype)) else list(value)
    dtypes = []
    for name in names:
        dtype = name if isinstance(name, torch.dtype) else getattr(torch, str(name).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise BadSetting(f"{where}: bench_dtypes= names {name!r}, not a floating dtype; "
                             "use e.g. ['float32', 'bfloat16']")
        dtypes.append(dtype)
    return dtypes


check = Bench()
