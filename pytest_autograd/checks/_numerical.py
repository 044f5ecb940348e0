"""Evaluating ``fn(leaves)`` at moved leaves, and the error record both derivative strategies report.

Every leaf is one flat stretch of a single global index space, so a
direction can move one element, one leaf, or every leaf at once; results
are projected on a cotangent only after subtracting two evaluations output
by output, so the cancellation happens per element (exactly), not in a sum
of a million terms.
"""

import math
from dataclasses import dataclass, field

import torch

from pytest_autograd.engine.execution import OpRaised, grads_of
from pytest_autograd.results.compare import fmt, fmt_index, unravel


@dataclass
class DerivativeError:
    output: str
    argument: str
    element: str
    expected: float
    got: float
    abs_error: float
    tolerance: float
    strategy: str
    argument_grad_all_zero: bool
    numerical_nonzero: bool
    evidence: list = field(default_factory=list)  # the Jacobians behind it, for failure pictures
    # The other wrong arguments, each with its own worst element (DerivativeErrors), worst first.
    others: list = field(default_factory=list)
    # What all of this argument's elements show (a _patterns.Pattern), not only the worst one; None: no known shape.
    pattern: object = None
    # Where the numbers come from, so a script can recompute them (see engine/repro.py): which leaf, element,
    # output row or cotangent, direction.
    locus: dict = None
    expected_label: str = "numerical"  # what the expected value is
    # Found along a direction known to be smooth (or by linearity in grad_output): a tie cannot explain it.
    smooth: bool = False
    at: tuple = None  # (leaf number, flat index) of the input element it is about, when it is about one

    def worst(self):
        return f"{self.element}: expected {fmt(self.expected)} ({self.expected_label}), got {fmt(self.got)} (analytical)"

    def error_line(self):
        return f"abs error {fmt(self.abs_error)} > tolerance {fmt(self.tolerance)} ({self.strategy})"

    def ratio(self):
        return self.abs_error / max(self.tolerance, 1e-300)

    def also_line(self):
        """One line naming this (another) wrong argument and its own worst element, for a report's details."""
        return (f"also w.r.t. `{self.argument}`: {self.worst()}; abs error {fmt(self.abs_error)} > tolerance "
                f"{fmt(self.tolerance)}")


@dataclass
class Precomputed:
    """What another computation of the same sample already made, so the derivative engine need not (see
    ``_first_order``): the cotangents (one per judged output), the analytical gradients along them (one per leaf),
    and the first probes' directions (flat over every leaf's elements) with ``at(k, sign)``, the judged outputs at
    ``leaves + sign * eps * directions[k]``. ``on_spent()`` is told when backward turns out to spoil its graph."""

    cotangents: list
    analytical: list
    directions: list = field(default_factory=list)
    at: object = None
    eps: float = None  # the step ``at`` was evaluated with
    on_spent: object = None


class Evaluator:
    """``fn`` at ``leaves + step``, where a step is a flat tensor over all leaves (or per-leaf parts)."""

    def __init__(self, fn, leaves, diff, needs_grad):
        self.fn, self.diff, self.needs_grad = fn, diff, needs_grad
        # ``fn.on_fresh``, when given: ``fn`` on leaves made for that call alone, which it need not copy again
        self.on_fresh = getattr(fn, "on_fresh", None)
        # ``fn.values_only``, when given: ``fn``'s values without the graph of its result (a backward needs grad
        # mode to run, not to be differentiated again when only its values are compared)
        self.values_only = getattr(fn, "values_only", fn)
        self.base = [leaf.detach() for leaf in leaves]
        self.sizes = [b.numel() for b in self.base]
        self.offsets = [0]
        for size in self.sizes:
            self.offsets.append(self.offsets[-1] + size)
        self.numel = self.offsets[-1]
        self.dtype = self.base[0].dtype if self.base else torch.float64
        self.device = self.base[0].device if self.base else torch.device("cpu")
        # backward writes into what forward saved: every further backward needs a graph of its own (grads_again)
        self.spent_by_backward = False

    def split(self, flat):
        """Per-leaf views of a flat vector over all leaves."""
        return [flat[a:b].view(base.shape) for base, a, b in zip(self.base, self.offsets[:-1], self.offsets[1:])]

    def leaf_of(self, flat_index):
        """(leaf number, index tuple in that leaf) of a global flat index."""
        for j, (a, b) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            if a <= flat_index < b:
                return j, unravel(flat_index - a, self.base[j].shape)
        raise IndexError(flat_index)

    def at(self, steps):
        """Detached floating outputs at ``leaves + steps`` (``steps``: per-leaf tensors or None)."""
        if self.on_fresh is not None and not self.needs_grad:
            with torch.no_grad():
                outputs = self.on_fresh([base.clone() if step is None else base + step
                                         for base, step in zip(self.base, steps)])
            return [outputs[k].detach() for k in self.diff]
        moved = [base if step is None else base + step for base, step in zip(self.base, steps)]
        with torch.set_grad_enabled(self.needs_grad):
            if self.needs_grad:
                moved = [m.detach().requires_grad_(True) for m in moved]
            outputs = self.values_only(moved)
        return [outputs[k].detach() for k in self.diff]

    def at_flat(self, flat_step):
        return self.at(self.split(flat_step))

    def grads_on_a_fresh_graph(self, cotangents):
        """Gradients along ``cotangents`` from a forward run anew on fresh copies of the leaves."""
        leaves = [base.clone().requires_grad_(True) for base in self.base]
        with torch.enable_grad():
            outputs = self.fn(leaves)
        return grads_of([outputs[k] for k in self.diff], leaves, cotangents)


def grads_again(outputs, leaves, cotangents, evaluator):
    """Another backward through the graph of ``outputs``, or through a fresh one where that graph is spent.

    A backward that writes into what forward saved (a memory-saving backward, declared with ``mutates=`` or
    not) cannot run twice on one graph: torch refuses the second run, or, where a kernel wrote through a raw
    pointer, the second run reads the first one's gradients. The gradients then come from a forward run anew,
    so a check judges the gradient, not the consequence of the earlier write.
    """
    if evaluator.spent_by_backward:
        return evaluator.grads_on_a_fresh_graph(cotangents)
    try:
        return grads_of(outputs, leaves, cotangents, retain_graph=True)
    except OpRaised as raised:
        if not spent_graph(raised):
            raise
        evaluator.spent_by_backward = True
        return evaluator.grads_on_a_fresh_graph(cotangents)


def spent_graph(raised):
    """Whether an OpRaised is torch refusing a backward through a graph whose saved tensors were written."""
    return isinstance(raised.error, RuntimeError) and "modified by an inplace operation" in str(raised.error)


def projected_difference(cotangents, first, second):
    """``<v, first - second>`` summed over outputs, in float64."""
    total = 0.0
    for v, a, b in zip(cotangents, first, second):
        total += float(torch.dot(v.reshape(-1).to(torch.float64), (a - b).reshape(-1).to(torch.float64)))
    return total


def pick(current, candidate):
    """The worse of two DerivativeErrors (by error over tolerance)."""
    if candidate is None:
        return current
    if current is None:
        return candidate
    return candidate if candidate.ratio() > current.ratio() else current


def with_others(errors):
    """The worst of ``errors`` (one per argument), carrying the rest as ``others``, worst first; None if empty."""
    ranked = sorted((error for error in errors if error is not None), key=lambda error: -error.ratio())
    if not ranked:
        return None
    first = ranked[0]
    first.others = [error for error in ranked[1:] if error.argument != first.argument]
    return first


def worst_of(numerical, analytical, atol, rtol, excluded=None):
    """Worst element of ``numerical`` vs ``analytical`` over the tolerance, or None.

    ``excluded`` (a bool mask) marks elements judged elsewhere (kinks).
    """
    if numerical.numel() == 0:
        return None
    if excluded is None and _within(numerical, analytical, atol, rtol):
        return None
    error = (numerical - analytical).abs()
    error = torch.where(error.isnan(), torch.full_like(error, math.inf), error)
    tolerance = atol + rtol * numerical.abs()
    ratio = error / tolerance
    # A numerical value that is not finite (outputs inf/NaN at the sample itself: its elements outside the op's
    # domain) must not hide the other elements from argmax: it fails, ahead of a backward's own inf/NaN, which
    # may only be the sample's undefined outputs propagated (0 * inf in a batched backward).
    ratio = torch.where(ratio.isnan() | ~numerical.isfinite(), torch.full_like(ratio, math.inf),
                        ratio.clamp(max=torch.finfo(ratio.dtype).max))
    if excluded is not None:
        ratio = torch.where(excluded, torch.zeros_like(ratio), ratio)
    flat = int(torch.argmax(ratio))
    if not bool(ratio.view(-1)[flat] > 1):
        return None
    position = unravel(flat, numerical.shape)
    return position, float(numerical[position]), float(analytical[position]), float(error[position]), \
        float(tolerance[position])


def _within(numerical, analytical, atol, rtol):
    """Whether every element is within ``atol + rtol * |numerical|``, decided in a few passes (the usual
    verdict); a NaN compares False and leaves the verdict to the full search."""
    allowed = numerical.abs().mul_(rtol).add_(atol)
    return bool(((numerical - analytical).abs_() <= allowed).all())


def index_label(flat, shape):
    return fmt_index(unravel(flat, shape))
