"""Where an argument's wrong elements lie: one element, one slice (a column, a row), or spread over it.

A backward wrong in one column only (an index off for it, a special-cased
last column) is a different bug from a formula wrong everywhere, and a hint
that says which is the most useful one. A ``Region`` is the set of elements
sharing the wrong elements' index along every dim where those all agree.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.results.compare import fmt_index, unravel


@dataclass
class Region:
    """The elements of an argument of ``shape`` whose index is ``fixed[dim]`` along each dim of ``fixed``."""

    shape: tuple
    fixed: dict  # dim -> index

    def mask(self, device=None):
        """A flat bool mask over the argument's elements."""
        numel = _numel(self.shape)
        inside = torch.ones(numel, dtype=torch.bool, device=device)
        flat = torch.arange(numel, device=device)
        for dim, index in self.fixed.items():
            inside &= (flat // _stride(self.shape, dim)) % self.shape[dim] == index
        return inside

    def size(self):
        return _numel(self.shape) // _numel([self.shape[dim] for dim in self.fixed])

    def single(self):
        return self.size() == 1

    def describe(self, name):
        """``column 2 of `x```, ``row 1 of `x```, or ``x[:, 3, :]`` for other slices (one element: its index)."""
        if len(self.shape) == 2 and len(self.fixed) == 1:
            (dim, index), = self.fixed.items()
            return f"{'row' if dim == 0 else 'column'} {index} of `{name}`"
        if self.single():
            return f"`{name}{fmt_index(unravel(int(self.mask().nonzero()[0]), self.shape))}`"
        return f"`{name}[" + ", ".join(str(self.fixed[d]) if d in self.fixed else ":" for d in range(len(self.shape))) \
            + "]`"


def common_region(flat_indices, shape):
    """The Region every element of ``flat_indices`` lies in: along each dim longer than 1 where they all share their
    index, that index. None when they share none (spread over the argument) or the argument is one element."""
    flat_indices = [int(i) for i in flat_indices]
    if not flat_indices:
        return None
    indices = [unravel(flat, shape) for flat in flat_indices]
    fixed = {dim: indices[0][dim] for dim in range(len(shape))
             if shape[dim] > 1 and all(index[dim] == indices[0][dim] for index in indices)}
    return Region(tuple(shape), fixed) if fixed else None


def element_region(flat, shape):
    """The Region of element ``flat`` alone."""
    index = unravel(flat, shape)
    return Region(tuple(shape), {dim: index[dim] for dim in range(len(shape)) if shape[dim] > 1})


def slices_through(flat, shape):
    """One Region per dim longer than 1 of an argument with at least two such dims: the slice through element
    ``flat`` along it (its row and its column, for a matrix)."""
    index = unravel(flat, shape)
    long = [dim for dim in range(len(shape)) if shape[dim] > 1]
    return [Region(tuple(shape), {dim: index[dim]}) for dim in long] if len(long) > 1 else []


def intersection(regions):
    """The Region of the elements in all of ``regions`` (of one argument), or None for no regions."""
    if not regions:
        return None
    fixed = {}
    for region in regions:
        fixed.update(region.fixed)
    return Region(regions[0].shape, fixed)


def _numel(shape):
    total = 1
    for size in shape:
        total *= size
    return total


def _stride(shape, dim):
    return _numel(shape[dim + 1:])
