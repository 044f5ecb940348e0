"""Ties: equal values in an argument, where a selection op (top-k, sort, max, median, argmax routing) flips.

At a tie a selection op is not differentiable: moving one tied element up
or down changes which element is selected, or where it lands among the
outputs, so a finite difference measures another selection than the one
backward differentiates (top-k over integer-valued votes: "expected 0
(numerical), got 1"). Neither is wrong. The derivative checks judge such an
op where the selection does not flip, and only when the tied point itself
failed:

* at a tie-free point: each group of tied elements moved apart by distinct
  multiples of a step far below the gap to any other value (and far above
  the finite-difference step), so no other order changes; a wrong gradient
  away from ties still fails there;
* along every tie group moved together, at the tied point itself: moving a
  whole group keeps its internal order, so the op is smooth along that
  direction and the gradients of tied elements must add up to its
  derivative (a max giving each of k ties the full gradient is k times too
  large there).

When both agree, the tie is noted, never failed.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._numerical import unravel
from pytest_autograd.results.compare import fmt, fmt_index

MIN_STEP_OVER_EPS = 1000.0  # the tie-breaking step must dwarf the finite-difference step


@dataclass
class Ties:
    """The tied elements of some tensors: per tensor, a group id per element (-1: not tied)."""

    groups: list  # per tensor: long tensor of its shape, or None when it has no ties
    counts: list  # per tensor: number of tie groups
    example: str  # "x[0, 2] = x[0, 5] = 4"

    def __bool__(self):
        return any(count for count in self.counts)

    def holds(self, tensor, flat):
        """True when element ``flat`` of tensor number ``tensor`` is tied with another one."""
        group = self.groups[tensor]
        return group is not None and int(group.reshape(-1)[flat]) >= 0

    def describe(self, names):
        tied = [f"`{name}` ({count} group{'s' if count > 1 else ''})" for name, count in zip(names, self.counts)
                if count]
        return f"tied values in {', '.join(tied)}, e.g. {self.example}"


def find_ties(tensors, names):
    """The exact ties within each floating tensor (values shared by two or more of its elements)."""
    groups, counts, example = [], [], ""
    for tensor, name in zip(tensors, names):
        values = tensor.detach()
        if not values.is_floating_point() or values.numel() < 2:
            groups.append(None)
            counts.append(0)
            continue
        flat = values.reshape(-1)
        _, inverse, occurrences = torch.unique(flat, return_inverse=True, return_counts=True)
        tied = (occurrences[inverse] > 1) & flat.isfinite()
        if not bool(tied.any()):
            groups.append(None)
            counts.append(0)
            continue
        group = torch.where(tied, inverse, torch.full_like(inverse, -1))
        groups.append(group.reshape(values.shape))
        counts.append(int(torch.unique(group[tied]).numel()))
        if not example:
            first = int(group[tied][0])
            where = (group == first).nonzero().flatten()[:2].tolist()
            index = [fmt_index(unravel(i, values.shape)) for i in where]
            example = f"{name}{index[0]} = {name}{index[1]} = {fmt(float(flat[where[0]]))}"
    return Ties(groups, counts, example)


def tie_free(tensors, ties, generator, eps):
    """Copies of ``tensors`` with every tie group's elements moved apart; None when no safe step exists.

    Tied element number r (a random order) of a group moves up by r * step,
    with step = gap / (2 * largest group), gap the smallest distance between
    two distinct values of that tensor: no element reaches another value, so
    only the ties' order is decided. ``eps``, the finite-difference step (one
    per tensor, or one for all), must be far below the step.
    """
    steps = eps if isinstance(eps, (list, tuple)) else [eps] * len(tensors)
    moved = []
    for tensor, group, eps in zip(tensors, ties.groups, steps):
        values = tensor.detach()
        if group is None:
            moved.append(values.clone())
            continue
        flat, ids = values.reshape(-1), group.reshape(-1)
        distinct = torch.unique(flat[flat.isfinite()])
        gaps = distinct[1:] - distinct[:-1]
        gap = float(gaps.min()) if gaps.numel() else max(float(distinct.abs().max()), 1.0)
        largest = int(torch.bincount(ids[ids >= 0]).max())
        step = gap / (2 * largest)
        if not math.isfinite(step) or step <= 0 or step < MIN_STEP_OVER_EPS * eps:
            return None
        rank = torch.zeros_like(flat)
        for g in torch.unique(ids[ids >= 0]).tolist():
            members = (ids == g).nonzero().flatten()
            order = torch.randperm(members.numel(), generator=generator).to(members.device)
            rank[members] = order.to(flat.dtype)
        moved.append((flat + rank * step).reshape(values.shape))
    return moved


def group_direction(tensors, ties, generator):
    """A direction moving every tie group rigidly, each at its own random rate in [1, 2] (zero elsewhere)."""
    direction = []
    for tensor, group in zip(tensors, ties.groups):
        step = torch.zeros(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        if group is not None:
            ids = group.reshape(-1)
            rates = 1 + torch.rand(int(ids.max()) + 1, generator=generator, dtype=torch.float64)
            flat = step.reshape(-1)
            tied = ids >= 0
            flat[tied] = rates.to(device=step.device, dtype=step.dtype)[ids[tied]]
        direction.append(step)
    return direction


def tie_free_sample(case, sample, generator):
    """(the sample with ties in its differentiated arguments moved apart, Ties, names), or None without ties.

    ``constants=`` arguments keep their values (indices or masks stored as
    floats). The step is at least a thousandth of the gap between distinct
    values, far above the rounding of float32.
    """
    slots = [i for i, a in enumerate(sample.args)] + list(sample.kwargs)
    values = sample.values()
    chosen = [(slot, value) for slot, value in zip(slots, values)
              if isinstance(value, torch.Tensor) and value.is_floating_point() and slot not in case.constant_slots]
    if not chosen:
        return None
    names = [case.arg_name(slot) for slot, _ in chosen]
    ties = find_ties([value for _, value in chosen], names)
    if not ties:
        return None
    tensors = [value.detach().to(torch.float64) for _, value in chosen]
    moved = tie_free(tensors, ties, generator, [0.0] * len(tensors))
    if moved is None:
        return None
    replaced = {slot: m.to(value.dtype) for (slot, value), m in zip(chosen, moved)}
    if find_ties(list(replaced.values()), names):  # rounding to the sample's dtype tied them again
        return None
    args = [replaced.get(i, a) for i, a in enumerate(sample.args)]
    kwargs = {k: replaced.get(k, v) for k, v in sample.kwargs.items()}
    return sample.replace(args=args, kwargs=kwargs), ties, names
