"""Derivatives of an op that draws random numbers: every evaluation draws the same ones.

Noise injection (``x + 0.1 * torch.randn_like(x)``), reparameterized samples
(``mu + sigma * eps``), Gumbel noise and dropout draw new numbers on every
call. A finite difference ``(f(x + h) - f(x - h)) / 2h`` is the derivative
only where both evaluations draw what the forward whose backward is judged
drew; otherwise it measures the noise divided by ``h``. So the derivative
checks start torch's global generators (the CPU's, and the item's CUDA
device's) from one seed before every evaluation of the op: the forward at the
sample, whose backward gives the analytical derivative, each probe, each
column of a Jacobian, each backward that gradgradcheck differentiates.

A backward that draws the noise again instead of using what forward drew
(saved on ``ctx``) then fails: its draws continue the stream after forward's,
so they differ. Draws from a ``torch.Generator`` of the op's own are left
alone, as everywhere (``engine/random_draws``).
"""

from pytest_autograd.checks._reruns import seed_generators

DEFAULT_SEED = 0x5EED  # for callers that do not say which seed their own forward at the sample started from


def draws_seed(context, index):
    """The seed the derivative checks start every evaluation of sample ``index`` from: shared work's seed, so
    gradcheck and gradgradcheck draw alike whichever of them evaluated the op first."""
    return context.shared_work_seed("draws", index) % (2 ** 63 - 1)


def start_draws(device, seed):
    """Start the global generators ``device`` uses from ``seed`` (before one evaluation of the op)."""
    seed_generators(str(device), seed)


def with_same_draws(fn, seed, device):
    """``fn(leaves)`` (and its ``on_fresh`` / ``values_only`` forms, where it has them) starting torch's
    generators from ``seed`` at every call."""
    if getattr(fn, "draws_seed", None) == seed:
        return fn

    def seeded(method):
        def call(leaves):
            start_draws(device, seed)
            return method(leaves)

        return call

    wrapped = seeded(fn)
    for name in ("on_fresh", "values_only"):
        method = getattr(fn, name, None)
        if method is not None:
            setattr(wrapped, name, seeded(method))
    wrapped.draws_seed = seed
    return wrapped


def device_of(leaves):
    return leaves[0].device if leaves else "cpu"




DRAWS_HINT = ("backward draws random numbers from torch's global generator: every evaluation here started it from "
              "one seed, so forward drew alike in each, and backward's draws are other numbers than forward's. Save "
              "what forward drew (ctx.save_for_backward(noise)) and use it in backward instead of drawing again")


def random_draws_hint(context, sample):
    """The hint for a derivative failure of an op whose backward draws from torch's global generator (the
    generator's state moves during backward), else None."""
    import torch

    from pytest_autograd.checks._reruns import generator_states
    from pytest_autograd.engine.execution import OpRaised, grads_of, prepare, random_cotangents, run_op

    try:
        with torch.random.fork_rng(devices=_cuda(context.device)):
            prepared = prepare(context.case, sample, context.device)
            outputs = run_op(context.case, prepared)
            if not prepared.leaves or not any(out.requires_grad for out in outputs):
                return None
            cotangents = random_cotangents(outputs, torch.Generator().manual_seed(0))
            before = generator_states(context.device)
            grads_of(outputs, prepared.leaves, cotangents)
            after = generator_states(context.device)
    except (OpRaised, RuntimeError):
        return None
    moved = any(not torch.equal(before[label], after[label]) for label in before)
    return DRAWS_HINT if moved else None


def _cuda(device):
    from pytest_autograd.engine.devices import cuda_devices

    return cuda_devices(str(device))


__all__ = ["DEFAULT_SEED", "device_of", "draws_seed", "random_draws_hint", "start_draws", "with_same_draws"]
