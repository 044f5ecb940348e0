"""DTensor's placements, read the way DTensor reads them: how a global tensor becomes the ranks' local ones, and
how the ranks' local tensors make the global one.

* ``Shard(d)``: rank ``r`` holds chunk ``r`` of ``torch.chunk(t, world_size, d)`` (uneven as DTensor splits:
  the last ranks may hold fewer, or none); the global tensor is the chunks concatenated.
* ``Replicate()``: every rank holds the whole tensor; the global tensor is any rank's, and every rank's must
  be the same.
* ``Partial()``: every rank holds a part, and the global tensor is their sum. A global tensor handed to ranks
  as ``Partial`` is split into sign-mixed parts that sum to it (a cotangent flowing back into a
  copy-to-region mapping from the sharded layer after it arrives so).

The placements are torch's own objects (``torch.distributed.tensor.Shard``, ``Replicate``, ``Partial``), told
apart by their class names, so any torch that has them works.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.engine.outcomes import UsageProblem

KINDS = ("Shard", "Replicate", "Partial")
EXAMPLE = 'placements={"x": Replicate(), "weight": Shard(0)} (from torch.distributed.tensor import Shard, Replicate)'


@dataclass(frozen=True)
class Placement:
    """One placement: ``kind`` is "Shard", "Replicate" or "Partial"; ``dim`` the dim a Shard splits."""

    kind: str
    dim: int = None

    def __str__(self):
        return f"Shard({self.dim})" if self.kind == "Shard" else f"{self.kind}()"


REPLICATE = Placement("Replicate")
PARTIAL = Placement("Partial")


def placement_of(value, where):
    """A Placement from torch's (or this module's own) placement object; a usage error naming the fix otherwise."""
    if isinstance(value, Placement):
        return value
    kind = type(value).__name__.lstrip("_")
    if kind == "Shard" and isinstance(getattr(value, "dim", None), int):
        return Placement("Shard", value.dim)
    if kind in ("Replicate", "Partial"):
        if kind == "Partial" and str(getattr(value, "reduce_op", "sum")).lower() not in ("sum", "redopttype.sum"):
            raise UsageProblem(f"{where}: Partial({value.reduce_op!r}) is not supported: only sums (Partial()) are")
        return Placement(kind)
    raise UsageProblem(f"{where}: {value!r} is not a placement; use torch.distributed.tensor's Shard(dim), "
                       f"Replicate() or Partial(), e.g. {EXAMPLE}")


def shard(tensor, placement, world_size, generator=None):
    """The ranks' local tensors of ``tensor`` under ``placement``."""
    if placement.kind == "Replicate":
        return [tensor for _ in range(world_size)]
    if placement.kind == "Partial":
        return _parts(tensor, world_size, generator)
    dim = placement.dim % tensor.dim() if tensor.dim() else 0
    chunks = list(torch.chunk(tensor, world_size, dim)) if tensor.dim() else [tensor]
    while len(chunks) < world_size:  # DTensor's empty shards for the ranks past the last chunk
        chunks.append(tensor.narrow(dim, tensor.shape[dim], 0))
    return chunks


def _parts(tensor, world_size, generator):
    """Sign-mixed parts summing to ``tensor`` (exactly in float64, to rounding below), none of them a share: each
    part is ``tensor`` times multipliers drawn per element, so the split is linear in ``tensor`` (gradcheck's
    probes of a backward along such cotangents see a linear map whenever the op's backward is one)."""
    if not tensor.is_floating_point() or world_size == 1:
        return [tensor] + [torch.zeros_like(tensor) for _ in range(world_size - 1)]
    parts = [tensor * (1 / world_size + torch.randn(tensor.shape, generator=generator, dtype=torch.float64)).to(
        tensor.device, tensor.dtype) for _ in range(world_size - 1)]
    return parts + [tensor - sum(parts)]


def assemble(locals_, placement):
    """(the global tensor of the ranks' ``locals_`` under ``placement``, the ranks that disagree with rank 0 for a
    Replicate one (empty when they agree))."""
    if placement.kind == "Shard":
        dim = placement.dim % locals_[0].dim() if locals_[0].dim() else 0
        return torch.cat([t for t in locals_ if t.numel()] or [locals_[0]], dim), []
    if placement.kind == "Partial":
        return sum(locals_[1:], locals_[0]), []
    first = locals_[0]
    differ = [rank for rank, other in enumerate(locals_) if rank and not _same(first, other)]
    return first, differ


def _same(a, b):
    if a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(torch.allclose(a, b, rtol=1e-6, atol=1e-12, equal_nan=True))
    return bool(torch.equal(a, b))


def owner(placement, shape, index, world_size):
    """Which rank(s) hold element ``index`` (a tuple) of a global tensor of ``shape``: one rank for a Shard, all of
    them otherwise; and the range of the sharded dim that rank holds."""
    if placement.kind != "Shard" or not shape:
        return list(range(world_size)), None
    dim = placement.dim % len(shape)
    size = shape[dim]
    step = -(-size // world_size)  # torch.chunk's chunk size
    rank = min(index[dim] // step, world_size - 1) if step else 0
    return [rank], (dim, rank * step, min(size, (rank + 1) * step))
