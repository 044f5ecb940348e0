"""Derivatives of an op that draws random numbers: every evaluation draws the same ones.

Noise injection (``x + 0.1 * torch.randn_like(x)``), reparameterized samples
(``mu + sigma * eps``), Gumbel noise and dropout draw new numbers on every
call. A finite difference ``(f(x + h) - f(x - h)) / 2h`` is the derivative
only where both evaluations draw what the forward whose backward is judged
drew; otherwise it measures the noise divided by ``h``. So the derivative
checks put every source of random numbers back where it was before each
evaluation of the op: the forward at the sample, whose backward gives the
analytical derivative, each probe, each column of a Jacobian, each backward
that gradgradcheck differentiates. The sources are torch's global
generators (the CPU's, and the item's CUDA device's), Python's ``random``
and numpy's global generator, all started from one seed, and every
``torch.Generator`` of the op's own that its forward at the sample drew
from (seen there by :class:`_OwnGenerators`), put back in the state it had
before that forward.

A backward that draws the noise again instead of using what forward drew
(saved on ``ctx``) then fails: its draws continue the stream after forward's,
so they differ.
"""

import random
import sys

import torch

from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.engine.dispatch_mode import DispatchMode

DEFAULT_SEED = 0x5EED  # for callers that do not say which seed their own forward at the sample started from


class Draws:
    """The random numbers every evaluation of an op on one sample starts from (see the module's docstring)."""

    def __init__(self, seed, device):
        self.seed, self.device = seed, str(device)
        self.own = {}  # id of a torch.Generator the op drew from -> (the generator, its state before the op's draws)
        self.watched = False  # the first evaluation ran, and saw which generators of its own the op draws from

    def start(self):
        """Put every source back: the global generators at the seed, the op's own at their states before."""
        seed_generators(self.device, self.seed)
        random.seed(self.seed)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(self.seed % 2 ** 32)
        for generator, state in self.own.values():
            generator.set_state(state)

    def evaluate(self, method, *args):
        """``method(*args)`` from the start; the first evaluation also finds the op's own generators."""
        self.start()
        if self.watched:
            return method(*args)
        self.watched = True
        with _OwnGenerators(self.own):
            return method(*args)


class _OwnGenerators(DispatchMode):
    """Records each ``torch.Generator`` passed to an aten call, with its state before the call draws from it."""

    def __init__(self, found):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Generator) and id(value) not in self.found:
                self.found[id(value)] = (value, value.get_state())
        return func(*args, **kwargs)


def draws_for(context, index):
    """The Draws of sample ``index`` on the context's device: from shared work's seed, so gradcheck and
    gradgradcheck draw alike whichever of them evaluated the op first."""
    return Draws(context.shared_work_seed("draws", index) % (2 ** 63 - 1), context.device)


def with_same_draws(fn, draws):
    """``fn(leaves)`` (and its ``on_fresh`` / ``values_only`` forms, where it has them) evaluated from ``draws``
    at every call."""
    if getattr(fn, "draws", None) is draws:
        return fn

    def seeded(method):
        def call(leaves):
            return draws.evaluate(method, leaves)

        return call

    wrapped = seeded(fn)
    for name in ("on_fresh", "values_only"):
        method = getattr(fn, name, None)
        if method is not None:
            setattr(wrapped, name, seeded(method))
    wrapped.draws = draws
    return wrapped


def default_draws(leaves):
    """Draws for a caller that did not evaluate the op itself yet: from DEFAULT_SEED on the leaves' device."""
    return Draws(DEFAULT_SEED, leaves[0].device if leaves else "cpu")


DRAWS_HINT = ("backward draws random numbers from torch's global generator: every evaluation here started it from "
              "one seed, so forward drew alike in each, and backward's draws are other numbers than forward's. Save "
              "what forward drew (ctx.save_for_backward(noise)) and use it in backward instead of drawing again")


def random_draws_hint(context, sample):
    """The hint for a derivative failure of an op whose backward draws from torch's global generator (the
    generator's state moves during backward), else None."""
    from pytest_autograd.checks._reruns import generator_states
    from pytest_autograd.engine.devices import cuda_devices
    from pytest_autograd.engine.execution import OpRaised, grads_of, prepare, random_cotangents, run_op

    try:
        with torch.random.fork_rng(devices=cuda_devices(str(context.device))):
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


__all__ = ["DEFAULT_SEED", "Draws", "default_draws", "draws_for", "random_draws_hint", "with_same_draws"]
