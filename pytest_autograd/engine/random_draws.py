"""Ops that draw from torch's global random generator, and the checks that cannot compare their runs.

Dropout, noise injection and stochastic rounding draw new numbers on every
call: two runs agree only when they draw the same ones, from the same seed
and with the same dtype, device and memory order. A check that compares
runs differing in one of those (float32 against float64, a transposed input
against a contiguous one, CPU against CUDA, the op against a reference that
draws its own) sees the draws differ and cannot tell that from a bug.

Such a check names what differs (``Check.random_draws_differ``). When it
fails, the runner asks whether the op draws from the global generator:
its outputs repeat when it is reseeded with one seed and change with
another. Then the check cannot judge the op, and it is skipped, saying why.
An op whose runs differ even from the same seed is nondeterministic, not
random: its failure stands. The derivative checks are not among them: they
compare runs in one dtype, layout and device, and a wrong backward of a
random op still fails there.
"""

import torch

from pytest_autograd.engine.device_faults import raise_if_fault
from pytest_autograd.engine.devices import cuda_devices
from pytest_autograd.engine.outcomes import OpRaised, UsageProblem

SEED_OFFSET = 7919  # the second seed: another stream than the item's own


def random_draws_reason(check_name, what, context, sample_index):
    """Why check ``check_name`` cannot judge the op (it draws from the global generator, and the check compares
    runs that draw differently: ``what``), or None. ``sample_index``: the failing sample (None: every sample is
    asked)."""
    if not what:
        return None
    samples = context.case.samples
    indices = [sample_index] if isinstance(sample_index, int) and sample_index < len(samples) else range(len(samples))
    if not any(_draws_from_global_generator(context, samples[index]) for index in indices):
        return None
    return (f"the op draws random numbers from torch's global generator (its outputs repeat from one seed and "
            f"change with another, as dropout's do), and {check_name} compares runs that draw different numbers "
            f"({what}), so it cannot judge the op; to have it judged, pass the op a torch.Generator (or a seed) "
            f"for its draws")


def _draws_from_global_generator(context, sample):
    """True when the op's outputs on ``sample`` are the same from one seed twice and differ from another seed."""
    try:
        first, again, other = (_outputs_from(context, sample, seed)
                               for seed in (context.seed, context.seed, context.seed + SEED_OFFSET))
    except (OpRaised, UsageProblem):
        return False
    except Exception as error:  # the question cannot be asked here (a device torch cannot seed): the failure stands
        raise_if_fault(error)
        return False
    return _same(first, again) and not _same(first, other)


def _outputs_from(context, sample, seed):
    from pytest_autograd.checks._reruns import seed_generators
    from pytest_autograd.engine.execution import prepare, run_op

    with torch.random.fork_rng(devices=cuda_devices(context.device)):
        seed_generators(context.device, seed)
        outputs = run_op(context.case, prepare(context.case, sample, context.device))
        return [out.detach().clone() for out in outputs if isinstance(out, torch.Tensor)]


def _same(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if torch.equal(x, y):
            continue
        if not (x.is_floating_point() or x.is_complex()) or not bool(((x == y) | (x.isnan() & y.isnan())).all()):
            return False
    return True


__all__ = ["random_draws_reason"]
