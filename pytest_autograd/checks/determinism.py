"""determinism: two runs on the same inputs give bitwise-equal outputs and gradients.

An op that draws random numbers from torch's generator (dropout, noise
injection, a reparameterized sample) is judged with the generator reseeded
before each run, and noted: its draws are not what this check is about.

Races and unordered atomic accumulation make a kernel's results change from
run to run by a few ulps; gradcheck's tolerance hides that, and training
runs then cannot be reproduced. Ops that accept this (atomics on purpose)
declare the bound with ``nondet_tol=`` on the marker.

The first run is the sample's plain run, shared with the other checks that
compare the op with itself (``_plain_run``); the second is the check's own.
"""

import torch

from pytest_autograd.checks._hygiene import max_difference
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import grads_of, output_label, random_cotangents
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.seeding import seed_torch
from pytest_autograd.results.compare import fmt, fmt_index


class Determinism(Check):
    name = "determinism"
    description = "forward and backward run twice on the same inputs give bitwise-equal results (nondet_tol=)"
    options = {"nondet_tol": 0.0}

    def run(self, context):
        tolerance = _tolerance(context.case)
        for index, sample in context.samples():
            prepared = context.prepare(sample)
            plain = plain_run(context, index, prepared)
            first, cotangents = _named(prepared, plain.outputs, plain.grads), plain.cotangents
            second, _ = _run(context, prepared, cotangents)
            differences = _differences(context, first, second)
            worst = max(differences, key=lambda d: d[1], default=None)
            if worst is None or worst[1] <= tolerance:
                continue
            label, largest, position, count, numel, values = worst
            details = [f"{name}: largest difference {fmt(diff)} ({n} of {total} elements differ)"
                       for name, diff, _, n, total, _ in differences if diff > 0]
            if _same_when_reseeded(context, prepared, cotangents):  # noise, dropout: random by design
                context.note("determinism: the op draws random numbers from torch's global generator (two runs "
                             "differ); judged with the generator reseeded before each run, where they are equal")
                continue
            context.fail(
                f"two runs on the same inputs differ: {label} changes by up to {fmt(largest)} "
                f"(nondet_tol {fmt(tolerance)})",
                output=label if not label.startswith("gradient") else None,
                argument=label.split("`")[1] if label.startswith("gradient") else None,
                worst=f"{label.replace('gradient w.r.t. ', 'grad ').replace('`', '')}{fmt_index(position)}: "
                      f"first run {_exact(values[0])}, second run {_exact(values[1])}",
                error=f"largest difference {fmt(largest)} > nondet_tol {fmt(tolerance)}; "
                      f"{count} of {numel} elements differ",
                details=details,
                hint="results depend on scheduling (atomics, races, unordered reductions) or on random numbers "
                     "from outside torch's generator (a generator of the op's own, numpy, Python's random): make "
                     "the kernel deterministic, draw from torch's generator, or declare the accepted bound with "
                     "nondet_tol=<max abs difference> on the marker",
            )


def _tolerance(case):
    value = case.option("nondet_tol", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UsageProblem(f"nondet_tol= must be a non-negative number (the largest accepted difference between "
                           f"two runs), got {value!r}.")
    return float(value)


def _run(context, prepared, cotangents):
    """Outputs and gradients of one forward + backward; draws the cotangents when not given."""
    outputs = context.run_op(prepared)
    if cotangents is None:
        cotangents = random_cotangents(outputs, context.generator, repeating=True)
    grads = []
    if prepared.leaves and any(out.requires_grad for out in outputs):
        grads = grads_of(outputs, prepared.leaves, cotangents)
    return _named(prepared, outputs, grads), cotangents


def _named(prepared, outputs, grads):
    """Copies: an op that writes every result into one buffer it reuses must not compare a run with itself."""
    named = [(output_label(k, len(outputs)), out.detach().clone()) for k, out in enumerate(outputs)]
    return named + [(f"gradient w.r.t. `{name}`", grad.detach().clone()) for name, grad in zip(prepared.names, grads)]


def _differences(context, first, second):
    """(label, largest difference, index, count, numel, (first, second)) for each result."""
    found = []
    if len(first) != len(second):
        context.fail("the op returned a different number of outputs on the second run")
    for (label, a), (_, b) in zip(first, second):
        if a.shape != b.shape:
            found.append((label, float("inf"), (), a.numel(), a.numel(), (list(a.shape), list(b.shape))))
            continue
        largest, position, count = max_difference(a, b)
        values = (None, None) if position is None else (_item(a[position]), _item(b[position]))
        found.append((label, largest, position or (), count, a.numel(), values))
    return found


def _exact(value):
    """Every digit: the two runs may differ in the last bit only."""
    return repr(value) if isinstance(value, float) else str(value)


def _item(value):
    value = value.item()
    return float(value) if isinstance(value, float) else value


def _same_when_reseeded(context, prepared, cotangents):
    """True when reseeding torch's RNG before each run makes the two runs agree."""
    from pytest_autograd.engine.devices import cuda_devices

    runs = []
    for _ in range(2):
        with torch.random.fork_rng(devices=cuda_devices(context.device)):
            seed_torch(context.seed)
            runs.append(_run(context, prepared, cotangents)[0])
    return all(largest == 0 for _, largest, *_ in _differences(context, *runs))


check = Determinism()
