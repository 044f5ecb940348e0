"""The ``autograd_bench`` fixture's callable: the bench check without a marker.

Returns the BenchResult so a test can assert on it; its rows join the
session's table, JSON and baselines, and a regression fails the test with
a readable message rather than a traceback.
"""

import pytest
import torch

from pytest_autograd.bench.config import BadSetting, parse_directions
from pytest_autograd.bench.measure import bench_point, machine_info
from pytest_autograd.bench.results import BaselineProblem, make_rows
from pytest_autograd.bench.state import stable_nodeid
from pytest_autograd.engine.case import Sample, build_case, normalise_samples
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.naming import display_name


def make_bench(request, state):
    used = {}

    def autograd_bench(fn, *args, reference=None, kwargs=None, name=None, flops=None, bytes=None,
                       budget=None, noise=None, cache=None, directions=None):
        """Time ``fn(*args, **kwargs)`` forward, backward alone and both (and ``reference``'s)."""
        node = request.node
        where = f"{node.nodeid}: autograd_bench"
        try:
            timer = state.timer.with_options(budget, noise, cache, where=where)
            chosen = parse_directions(directions, where)
            samples = normalise_samples(Sample(*args, **(kwargs or {})), where)
            case = build_case({"op": fn, "reference": reference, "flops": flops, "bytes": bytes}, samples)
            case.name = display_name(fn)
            result = bench_point(case, samples[0], _device(samples[0]), None, timer, chosen,
                                 torch.Generator().manual_seed(0))
        except (BadSetting, UsageProblem) as problem:
            pytest.fail(str(problem), pytrace=False)
        except OpRaised as raised:
            where_raised = raised.where()
            pytest.fail(f"autograd_bench: the {raised.phase} of {case.name} raised "
                        f"{type(raised.error).__name__}: {raised.error}" +
                        (f"\n  at {where_raised}" if where_raised else ""), pytrace=False)
        label = name or case.name
        used[label] = used.get(label, 0) + 1
        if used[label] > 1:
            label = f"{label}#{used[label]}"
        rows = make_rows(result, stable_nodeid(node), node.name, label=label)
        result.rows = rows
        try:
            regressions = state.compare_rows(rows)
        except BaselineProblem as problem:
            pytest.fail(f"autograd_bench: {problem}", pytrace=False)
        state.record(node, rows, machine_info(result.device))
        if regressions:
            pytest.fail(regression_message(label, state, regressions), pytrace=False)
        return result

    return autograd_bench


def regression_message(what, state, lines):
    rules = ", ".join(rule.describe() for rule in state.fail_rules or [])
    body = "\n".join(f"  {line}" for line in lines)
    return (f"{what}: {len(lines)} timing(s) regressed against baseline {state.compare!r} (limit {rules})\n{body}\n"
            f"  hint: if the slowdown is expected, save a new baseline with --autograd-bench-save={state.compare}")


def _device(sample):
    for value in sample.values():
        if isinstance(value, torch.Tensor):
            return str(value.device)
    return "cpu"
