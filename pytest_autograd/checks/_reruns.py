"""Helpers for checks that run an op several times and compare the runs: cheap seeding, a fast equality test.

``torch.manual_seed`` also seeds every lazily initialised backend (CUDA,
XPU, MTIA, ...), formatting a Python stack for each: about 2 ms a call.
Seeding only the generators the item's device uses costs microseconds.
"""

import torch


def seed_generators(device, seed):
    """Seed the CPU generator, and the item's CUDA device's one (``cuda:1``'s, not the current device's)."""
    from pytest_autograd.engine.devices import cuda_devices

    torch.default_generator.manual_seed(seed)
    for index in cuda_devices(device):
        torch.cuda.default_generators[index].manual_seed(seed)


def generators(device):
    """(label, get_state, advance) of the global generators an item's device uses."""
    from pytest_autograd.engine.devices import cuda_devices

    found = [("the CPU generator", torch.get_rng_state, lambda n: _draws(n, "cpu"))]
    for index in cuda_devices(device):
        found.append((f"the CUDA generator of cuda:{index}", lambda index=index: torch.cuda.get_rng_state(index),
                      lambda n, index=index: _draws(n, f"cuda:{index}")))
    return found


def _draws(count, device):
    """Advance a generator by ``count`` separate draws.

    One draw of n numbers would not do: a CUDA (Philox) generator moves its
    offset in whole steps per kernel launch, so ``torch.rand(1)`` and
    ``torch.rand(2)`` leave it in the same state.
    """
    for _ in range(count):
        torch.rand(1, device=device)


def generator_states(device):
    """{label: a copy of its state} for the global generators ``device`` uses."""
    return {label: get_state().clone() for label, get_state, _ in generators(device)}


def draw_seed(generator):
    """A seed drawn from a check's own generator."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))


def identical(a, b):
    """Bitwise-equal tensors of one shape and dtype: the common case, decided without a tolerance comparison."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def compare_runs(context, expected, got, summary, what, **fields):
    """Fail unless two runs of the op agree: dtype tolerances, widened to ``nondet_tol=`` when the op declares one."""
    if identical(expected, got):
        return
    from pytest_autograd.checks._agreement import agree
    from pytest_autograd.results.compare import compare_tensors

    atol, rtol = context.tolerance(expected.dtype)
    declared = context.case.option("nondet_tol", 0.0)
    if isinstance(declared, (int, float)) and not isinstance(declared, bool):
        atol = max(atol, float(declared))
    if agree(expected, got, atol, rtol):
        return
    mismatch = compare_tensors(expected, got, atol, rtol)
    if mismatch is not None:
        context.fail_mismatch(mismatch, summary, what, **fields)
