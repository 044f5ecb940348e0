"""One plain forward and backward of a sample, shared by the checks that compare the op with itself.

determinism (its first run), aliasing (the unchanged run), reentrancy (each
call alone), growth (the untracked call before the watched ones), rng (its
first run, with the generators' states around it) and requires_grad (the run
with every input requiring grad) each began the same way: the op on fresh
copies of the sample in its own dtypes, a random cotangent per output, the
gradients along them. A :class:`PlainRun` is that run, made once per sample
and device by whichever of them comes first: copies of the outputs and
gradients, fresh copies of the cotangents for each check that asks, and the
seed the global generators had, so an op that draws random numbers draws the
same ones when a check runs it again from that seed. Its draws come from a
generator seeded by the run (the test under pytest), not by the check, so a
check's verdict is the same whether it found the run made or made it: run
alone (``-k``), a check makes it itself. The outputs are copied after
backward, where a check that ran the op itself read them; the last check of
the built-in order that uses it (rng) lets it go.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.checks._reruns import draw_seed, generator_states, seed_generators
from pytest_autograd.engine.execution import grads_of, random_cotangents


@dataclass(frozen=True)
class PlainRun:
    seed: int  # the global generators' seed before forward
    drawn: list  # the cotangents as drawn, per output (None for one that is not differentiable); see ``cotangents``
    outputs: list  # copies taken after backward, as a check reading its own run's outputs sees them
    grads: list  # copies, per leaf; empty when no output carries a gradient (or the sample has no leaf)
    states: dict  # "before", "forward", "backward" (when run) -> the global generators' states then (the rng check)

    @property
    def cotangents(self):
        """Fresh copies of the cotangents: a backward that writes into grad_output changes its caller's copy only,
        never what the next check is handed."""
        return _copies(self.drawn)

    @property
    def differentiable(self):
        return bool(self.grads)


def plain_run(context, index, prepared):
    """The PlainRun of sample number ``index``, ``prepared`` in its own dtypes on the context's device: the one an
    earlier check of this run made, else made now (and kept while the case is)."""
    kept = context.case.__dict__.setdefault("_plain_runs", {})
    key = _key(context, index)
    if key not in kept:
        kept[key] = _run(context, index, prepared)
    return kept[key]


def _run(context, index, prepared):
    generator = torch.Generator().manual_seed(context.shared_work_seed("plain-run", index))
    seed = draw_seed(generator)
    seed_generators(context.device, seed)
    states = {"before": generator_states(context.device)}
    outputs = context.run_op(prepared)
    states["forward"] = generator_states(context.device)
    drawn = random_cotangents(outputs, generator, repeating=True)
    cotangents = _copies(drawn)  # the backward's own: it may write into them
    grads = []
    if prepared.leaves and any(out.requires_grad for out in outputs):
        grads = [g.detach().clone() for g in grads_of(outputs, prepared.leaves, cotangents)]
        states["backward"] = generator_states(context.device)
    return PlainRun(seed, drawn, [out.detach().clone() for out in outputs], grads, states)


def _copies(tensors):
    return [None if t is None else t.clone() for t in tensors]


def let_go(context, index):
    """Forget sample ``index``'s PlainRun on the context's device: its last user is done with it (a check after
    it makes it again, the same)."""
    kept = context.case.__dict__.get("_plain_runs", {})
    for rows in (False, True):
        kept.pop((index, str(context.device), rows), None)


def _key(context, index):
    """Sample ``index`` on the context's device, whole or its first rows (what the check judges there:
    ``_fewer_rows``)."""
    return index, str(context.device), index in context.rows_judged


__all__ = ["PlainRun", "let_go", "plain_run"]
