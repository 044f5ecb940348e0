"""What gradcheck and gradgradcheck both compute on one float64 sample, computed once.

On a large sample both checks are mostly calls of the op. gradcheck runs
the forward at the sample ``x`` with a random cotangent ``v`` (its
analytical gradient ``J^T v``) and at ``x +- eps d_k`` along a few random
directions (its probes). gradgradcheck differentiates the backward
``(x, v) -> J^T v``: its value at the sample is that same analytical
gradient, and its probes need the backward at ``(x +- eps d_k, v +- eps
u_k)``, after the very forwards gradcheck's probes ran.

A :class:`FirstOrder` holds them for one sample and device: the float64
leaves, the forward's outputs and the first gradients (with their graph
while gradgradcheck is to come), and, at each probe's point, the forward's
outputs and, for gradgradcheck, the backward's values there (the forward's
graph is dropped at once: holding six graphs costs more in fresh memory
than running the forwards again). Its draws (``v``, the ``d_k`` and the
``u_k``) come from a generator of its own, seeded by the run, not by the
check, so a check's verdict is the same whether it found the work done or
did it itself. Every evaluation of the op starts its random numbers from
one ``_same_draws.Draws``, which the derivative engine starts its own
evaluations from too: an op drawing random numbers draws alike in each.

The checks of one ``run_checks`` call (the fixtures, the model scan, a
script) share one case, and so one FirstOrder per sample and device; so do
the items of one pytest test on one device (``pytest_adapter/shared_cases``).
"""

from dataclasses import dataclass, field

import torch

from pytest_autograd.checks._derivatives import EPS
from pytest_autograd.checks._probing import PROBES
from pytest_autograd.checks._same_draws import draws_for
from pytest_autograd.engine.draws import probe_direction
from pytest_autograd.engine.execution import (
    OpRaised,
    declared_nondifferentiable,
    grads_of,
    random_cotangents,
    run_op,
)


@dataclass
class FirstOrder:
    """One float64 sample's forward, first gradients and probe evaluations (see the module's docstring)."""

    context: object  # the first check's context: the case, the device
    prepared: object  # the float64 Prepared: leaves and the arguments around them
    outputs: list  # the forward at the sample, with its graph
    cotangents: dict  # output position -> the random cotangent v (a leaf requiring grad while second ones follow)
    grads: list  # J^T v per leaf (zeros for an unused one), with its graph while second derivatives follow
    # One flat direction per shared probe: over the leaves (gradcheck's, ``d_k``), then, while second derivatives
    # follow, over the cotangents of the outputs that require grad (``u_k``; gradgradcheck's is the whole).
    drawn: list
    second: bool  # gradgradcheck is to come: its share is computed with gradcheck's
    draws: object  # where every evaluation of the op starts its random numbers (``_same_draws.Draws``)
    spent: bool = False  # a backward wrote into what the forward saved: the first gradients' graph is spoilt
    eps: float = EPS
    _backwards: dict = field(default_factory=dict)  # (k, sign) -> first gradients there, or the OpRaised

    @property
    def leaves(self):
        return self.prepared.leaves

    @property
    def numel(self):
        return sum(leaf.numel() for leaf in self.leaves)

    @property
    def directions(self):
        """gradcheck's directions ``d_k``, over the leaves."""
        return [d[:self.numel] for d in self.drawn]

    def second_cotangents(self):
        """The cotangents gradgradcheck differentiates the backward in: those of the outputs that require grad."""
        return [c for k, c in self.cotangents.items() if self.outputs[k].requires_grad]

    def forward_at(self, k, sign):
        """Detached outputs at ``x + sign * eps * d_k`` (gradgradcheck's backward there is run too, when it
        follows)."""
        return self._evaluate(k, sign)

    def backward_at(self, k, sign):
        """The first gradients at ``(x, v) + sign * eps * (d_k, u_k)``, handed over once (evaluated now when
        gradcheck did not)."""
        if (k, sign) not in self._backwards:
            self._evaluate(k, sign)
        found = self._backwards.pop((k, sign))
        if isinstance(found, OpRaised):
            raise found
        return found

    def _evaluate(self, k, sign):
        numel = self.numel
        moved = _moved(self.leaves, self.drawn[k][:numel], sign * self.eps)
        case = self.context.case
        self.draws.start()
        if not self.second:
            with torch.no_grad():
                return [out.detach() for out in run_op(case, self.prepared, moved, clone_leaves=False)]
        moved = [m.requires_grad_(True) for m in moved]
        with torch.enable_grad():
            outputs = run_op(case, self.prepared, moved)
        values = [out.detach() for out in outputs]
        differentiated = [j for j in self.cotangents if self.outputs[j].requires_grad]
        moved_cotangents = _moved(self.second_cotangents(), self.drawn[k][numel:], sign * self.eps)
        try:
            grads = grads_of([outputs[j] for j in differentiated], moved, moved_cotangents)
            self._backwards[(k, sign)] = [g.detach() for g in grads]
        except OpRaised as raised:  # gradgradcheck's to report, if it asks
            self._backwards[(k, sign)] = raised
        return values


def first_order(context, index, prepared, second):
    """The FirstOrder of sample number ``index``, ``prepared`` in float64 on the context's device: the one an
    earlier check of this run computed, else computed now. ``second``: gradgradcheck is to come and shares
    the work (the first gradients keep their graph, its evaluations are made with gradcheck's)."""
    kept = context.case.__dict__.setdefault("_first_orders", {})
    key = (index, str(context.device))
    if key in kept:
        return kept[key]
    try:
        made = _first_order(context, index, prepared, second)
    except OpRaised:
        if not second:
            raise
        # A backward that writes into grad_output cannot take it as a leaf that requires grad: gradcheck is
        # judged as it is alone, and gradgradcheck, alone, meets (and reports) the error itself.
        made = _first_order(context, index, prepared, False)
    if made.second:
        kept[key] = made  # for gradgradcheck, which lets it go
    return made


def _first_order(context, index, prepared, second):
    generator = torch.Generator().manual_seed(context.shared_work_seed("first-order", index))
    draws = draws_for(context, index)
    with torch.enable_grad():
        outputs = draws.evaluate(run_op, context.case, prepared)
        declared = declared_nondifferentiable(context.case, outputs)
        positions = [k for k, out in enumerate(outputs) if out.is_floating_point() and k not in declared]
        drawn = random_cotangents([outputs[k] for k in positions], generator)
        cotangents = {k: (c.requires_grad_(True) if second else c) for k, c in zip(positions, drawn) if c is not None}
        grads = grads_of([outputs[k] for k in cotangents], prepared.leaves, list(cotangents.values()),
                         create_graph=second, retain_graph=True) if prepared.leaves else []
    numel = sum(leaf.numel() for leaf in prepared.leaves)
    second_numel = sum(c.numel() for k, c in cotangents.items() if outputs[k].requires_grad) if second else 0
    drawn = [probe_direction(numel + second_numel, generator, prepared.leaves[0].device) for _ in range(PROBES)]
    return FirstOrder(context, prepared, outputs, cotangents, grads, drawn, second, draws)


def plan_and_first_order(context, index, sample, second):
    """``(plan, FirstOrder)`` of sample number ``index``: the ``float64_plan`` (None: judged in float64) and, when
    it is None and the sample has a differentiable argument, the sample's FirstOrder. An op whose float64 forward
    and backward run, with float64 outputs, needs no trial of its own for the plan: the FirstOrder is that trial."""
    from pytest_autograd.checks._float64_support import (
        adopt,
        declared_dtypes,
        float64_plan,
        plan_after_raising,
        plan_known,
    )

    declared = declared_dtypes(context.case)
    if not plan_known(context, sample) and (declared is None or torch.float64 in declared):
        prepared = context.prepare(sample, dtype=torch.float64)
        if not prepared.leaves:
            return float64_plan(context, sample), None
        try:
            made = first_order(context, index, prepared, second)
        except OpRaised as raised:  # the lower dtype it runs in, if any; else the float64 path reports the error
            plan = plan_after_raising(context, sample, raised)
            if plan is not None:
                return plan, None
            return None, first_order(context, index, context.prepare(sample, dtype=torch.float64), second)
        if all(out.dtype == torch.float64 for out in made.outputs if out.is_floating_point()):
            adopt(context, sample, None)
            return None, made
    plan = float64_plan(context, sample)
    if plan is not None:
        return plan, None
    prepared = context.prepare(sample, dtype=torch.float64)
    return None, first_order(context, index, prepared, second) if prepared.leaves else None


def let_go(context, index):
    """Forget sample ``index``'s FirstOrder on the context's device: its last user is done with it."""
    context.case.__dict__.get("_first_orders", {}).pop((index, str(context.device)), None)


def _moved(tensors, direction, step):
    """``tensors + step * direction``, ``direction`` flat over all of them: one pass each, no step tensor."""
    moved, start = [], 0
    for tensor in tensors:
        part = direction[start:start + tensor.numel()].view(tensor.shape)
        moved.append(torch.add(tensor.detach(), part, alpha=step))
        start += tensor.numel()
    return moved


__all__ = ["FirstOrder", "first_order", "let_go", "plan_and_first_order"]
