"""An op that talks across ranks, seen as one op on global tensors: what every check can judge.

``AcrossRanks(op, layout)`` is called with the global (unsharded) arguments.
It hands each rank its local shard of every argument (``layout``'s
placements), runs ``op`` on every rank of a real process group at once, and
assembles the ranks' outputs into global ones. Its backward hands each rank
its part of the global incoming gradient (``output_grad_placements``), runs
the ranks' backward, and assembles their gradients (``grad_placements``);
a replicated input's gradient must come out the same on every rank, and a
replicated output the same from every rank, or the call raises
:class:`RanksDisagree`. A rank that crashes, raises or hangs makes the call
raise :class:`RanksFailed`, naming each rank and where it died or waited.

So gradcheck's finite differences run through all ranks, the reference is
compared with the assembled outputs and gradients, and a failure's element
is in global coordinates (``explain`` adds the rank that holds it).
"""

import itertools
import weakref
from dataclasses import dataclass, field

import torch

from pytest_autograd.engine.distributed.placements import REPLICATE, assemble, shard
from pytest_autograd.engine.distributed.rank_side import backward_on_rank, forward_on_rank

_CALLS = itertools.count(1)


class RanksFailed(RuntimeError):
    """A rank crashed, raised or hung: each rank's fate, and where."""


class RanksDisagree(RuntimeError):
    """A replicated output or gradient is not the same on every rank."""


class LayoutMismatch(Exception):
    """The marker's placements do not fit what the op returned: a mistake in the layout, not in the op."""


@dataclass
class Layout:
    """Where each argument, output and gradient lives across ``world_size`` ranks (placements by argument slot:
    position or keyword name)."""

    world_size: int
    inputs: dict  # slot -> Placement (unnamed: Replicate)
    outputs: list  # one Placement per output (the last repeated for outputs past the list)
    output_grads: list = None  # None: DTensor's rule, from ``outputs``
    grads: dict = field(default_factory=dict)  # slot -> Placement (unnamed: the input's own)
    names: list = field(default_factory=list)  # the op's argument names, for messages
    setups: tuple = ()  # functions each rank calls with (rank, world_size) once the group is formed
    seconds: float = 30.0  # how long one call may take on the ranks (a collective some rank skipped waits forever)
    dtensors: bool = False  # the op takes and returns DTensors (rank_side wraps and unwraps them)

    def input(self, slot):
        return self.inputs.get(slot, REPLICATE)

    def output(self, index):
        return self.outputs[min(index, len(self.outputs) - 1)]

    def output_grad(self, index):
        if self.output_grads:
            return self.output_grads[min(index, len(self.output_grads) - 1)]
        placement = self.output(index)
        return placement if placement.kind == "Shard" else REPLICATE

    def grad(self, slot):
        if slot in self.grads:
            return self.grads[slot]
        placement = self.input(slot)
        return REPLICATE if placement.kind == "Partial" else placement

    def name(self, slot):
        if isinstance(slot, str):
            return slot
        return self.names[slot] if slot < len(self.names) else f"arg{slot}"


class AcrossRanks:
    """``op`` on ``layout.world_size`` ranks, called with global arguments (see the module's docstring)."""

    def __init__(self, op, layout):
        self.op, self.layout = op, layout
        self.origin = None  # where the ranks find the op when it cannot be sent itself (processes.transport)
        self.hung = None  # the RanksFailed of a call some rank hung in: the calls after it are not run again
        self.__name__ = getattr(op, "__name__", type(op).__name__)
        self.__qualname__ = getattr(op, "__qualname__", self.__name__)
        self.__module__ = getattr(op, "__module__", None)
        self.__wrapped__ = op

    def __call__(self, *args, **kwargs):
        if self.hung is not None:
            raise RanksFailed(f"{self.hung} (in an earlier call of this item; the ranks were not asked again)")
        keys = tuple(kwargs)
        values = (*args, *kwargs.values())
        keep = torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)
        return _Call.apply(self, (len(args), keys, keep), *values)

    def sent_op(self):
        """What stands for the op on the ranks: itself when it pickles, else its place on the test's marker."""
        from pytest_autograd.engine.outcomes import UsageProblem
        from pytest_autograd.engine.processes import transport

        try:
            transport.dumps(self.op)
            return self.op
        except Exception as error:  # noqa: BLE001 - a lambda, a local class: found through the marker
            if self.origin is None:
                raise UsageProblem(f"the op ({self.__name__}) cannot be sent to the ranks ({error}): define it at "
                                   "module level") from None
            return self.origin


class _Call(torch.autograd.Function):
    @staticmethod
    def forward(ctx, across, call_shape, *values):
        from pytest_autograd.engine.processes.ranks import rank_group

        layout = across.layout
        count, keys, keep = call_shape  # keep: a backward may follow (forward itself runs without grad)
        slots = list(range(count)) + list(keys)
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        generator = torch.Generator().manual_seed(1234)
        per_rank = [([], {}) for _ in range(layout.world_size)]
        for slot, value in zip(slots, values):
            parts = _local(value, layout.input(slot), layout.world_size, generator)
            for rank, part in enumerate(parts):
                if isinstance(slot, int):
                    per_rank[rank][0].append(part)
                else:
                    per_rank[rank][1][slot] = part
        call = next(_CALLS)
        group = rank_group(layout.world_size, device.type)
        sent = across.sent_op()
        released = _released()
        as_dtensors = None
        if layout.dtensors:  # each tensor's placement and global shape, for the ranks to wrap their shards in
            as_dtensors = ({slot: (layout.input(slot), tuple(value.shape)) for slot, value in zip(slots, values)
                            if isinstance(value, torch.Tensor)}, list(layout.outputs))
        outcomes = group.run(forward_on_rank, [(sent, call, args, kwargs, device.type, keep, released, as_dtensors)
                                               for args, kwargs in per_rank], timeout=layout.seconds,
                             setups=layout.setups)
        _raise_if_failed(outcomes, "forward", across)
        locals_ = [outcome.value for outcome in outcomes]
        _check_outputs_against(layout, locals_[0])
        outputs = []
        for index in range(len(locals_[0])):
            placement = layout.output(index)
            global_, differ = assemble([ranks[index].to(device) for ranks in locals_], placement)
            if differ:
                raise RanksDisagree(f"output {index} is {placement}, but rank(s) {_join(differ)} return other "
                                    "values than rank 0: an output every rank must hold whole (an all-reduce or "
                                    "all-gather missing, or done on some ranks only?)")
            outputs.append(global_)
        ctx.across, ctx.call, ctx.device, ctx.slots = across, call, device, slots
        ctx.leaves = [slot for slot, value in zip(slots, values) if isinstance(value, torch.Tensor)
                      and value.requires_grad]
        ctx.shapes = {slot: value.shape for slot, value in zip(slots, values) if isinstance(value, torch.Tensor)}
        ctx.dtypes = {slot: value.dtype for slot, value in zip(slots, values) if isinstance(value, torch.Tensor)}
        ctx.differentiable = [index for index, output in enumerate(outputs) if output.is_floating_point()]
        ctx.mark_non_differentiable(*[o for i, o in enumerate(outputs) if i not in ctx.differentiable])
        if keep and outputs:  # the ranks keep the call's graph until nothing here can take its backward
            weakref.finalize(outputs[0], _LET_GO.append, call)
        return tuple(outputs) if len(outputs) != 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads):
        from pytest_autograd.engine.processes.ranks import rank_group

        layout = ctx.across.layout
        generator = torch.Generator().manual_seed(4321)  # the same split of the same cotangent: runs compare bitwise
        per_rank = [[] for _ in range(layout.world_size)]
        for index, grad in enumerate(grads):
            parts = _local(grad, layout.output_grad(index), layout.world_size, generator) if grad is not None \
                else [None] * layout.world_size
            for rank, part in enumerate(parts):
                per_rank[rank].append(None if part is None else part.detach())
        group = rank_group(layout.world_size, ctx.device.type)
        released = _released()
        outcomes = group.run(backward_on_rank, [(ctx.call, cotangents, released) for cotangents in per_rank],
                             timeout=layout.seconds, setups=layout.setups)
        _raise_if_failed(outcomes, "backward", ctx.across)
        locals_ = [outcome.value for outcome in outcomes]
        found = {}
        for position, slot in enumerate(ctx.leaves):
            placement = layout.grad(slot)
            ranks = [_or_zeros(local[position], ctx, slot, rank, layout) for rank, local in enumerate(locals_)]
            global_, differ = assemble([g.to(ctx.device) for g in ranks], placement)
            if differ:
                raise RanksDisagree(
                    f"the gradient of `{layout.name(slot)}` is {placement} ({_why_grad(layout, slot)}), "
                    f"but rank(s) {_join(differ)} hold another one than rank 0: a replicated argument's gradient "
                    "must be summed over the ranks (an all-reduce missing in backward?), or declared "
                    f"grad_placements={{'{layout.name(slot)}': Partial()}} where the caller sums it (as DDP does)"
                    + (f"; on DTensors, `{layout.name(slot)}.to_local()` whose local gradient is each rank's partial "
                       "sum needs to_local(grad_placements=[Partial()])" if layout.dtensors else ""))
            if global_.shape != ctx.shapes[slot]:
                raise RanksDisagree(f"the gradient of `{layout.name(slot)}` assembled from the ranks ({placement}) "
                                    f"has shape {tuple(global_.shape)}, not the argument's {tuple(ctx.shapes[slot])}")
            found[slot] = global_
        return (None, None, *[found.get(slot) for slot in ctx.slots])


def _why_grad(layout, slot):
    """Where the gradient's placement comes from, in words."""
    name = layout.name(slot)
    if slot in layout.grads:
        return f"grad_placements= of `{name}`"
    if layout.input(slot).kind == "Partial":
        return f"`{name}` is Partial(): its gradient is the whole one, on every rank"
    return f"the placement of `{name}`"


def _check_outputs_against(layout, outputs):
    """The declared output placements fit what the op returned: as many as its outputs (or one for all), each Shard
    naming a dim the output has."""
    if len(layout.outputs) > max(len(outputs), 1):
        raise LayoutMismatch(f"output_placements= gives {len(layout.outputs)} placements, but the op returns "
                             f"{len(outputs)} output(s): give one placement, or one per output")
    for index, output in enumerate(outputs):
        for option, placement in (("output_placements", layout.output(index)),
                                  ("output_grad_placements", layout.output_grad(index))):
            if placement.kind == "Shard" and not -output.dim() <= placement.dim < max(output.dim(), 1):
                raise LayoutMismatch(f"{option}: {placement} for output {index}, which has {output.dim()} dim(s) "
                                     f"(shape {tuple(output.shape)} on rank 0): name a dim it has")


_LET_GO = []  # calls whose outputs were freed here since the ranks last heard: their graphs can go


def _released():
    found = list(_LET_GO)
    del _LET_GO[:len(found)]
    return found


def _local(value, placement, world_size, generator):
    """The ranks' parts of one argument: a tensor's shards, as fresh leaves where it requires grad; anything else
    as it is, on every rank."""
    if not isinstance(value, torch.Tensor):
        return [value] * world_size
    parts = shard(value.detach(), placement, world_size, generator)
    return [part.clone().requires_grad_(value.requires_grad) if value.is_floating_point() or value.is_complex()
            else part.clone() for part in parts]


def _or_zeros(grad, ctx, slot, rank, layout):
    """A rank's local gradient, zeros of its shard's shape where the op gave none (None: it does not depend on it)."""
    if grad is not None:
        return grad
    shape = list(ctx.shapes[slot])
    placement = layout.grad(slot)
    if placement.kind == "Shard" and shape:
        dim = placement.dim % len(shape)
        step = -(-shape[dim] // layout.world_size)
        shape[dim] = max(0, min(shape[dim], (rank + 1) * step) - rank * step)
    return torch.zeros(shape, dtype=ctx.dtypes[slot])


def _raise_if_failed(outcomes, phase, across):
    if all(outcome.returned for outcome in outcomes):
        return
    message = f"in its {phase}: " + "; ".join(_fate(rank, outcome) for rank, outcome in enumerate(outcomes))
    if any(outcome.hung is not None for outcome in outcomes):
        across.hung = message  # a wait that long again, for each call a check makes, would only cost time
    raise RanksFailed(message)


def _fate(rank, outcome):
    if outcome.returned:
        return f"rank {rank} finished"
    if outcome.hung is not None:
        frame = outcome.crash.crashed_frame() if outcome.crash is not None else None
        return f"rank {rank} waited {outcome.hung:.0f} s" + (f" at {frame}" if frame else "") + \
            " (in a collective the other ranks never reached?)"
    if outcome.crash is not None:
        frame = outcome.crash.crashed_frame()
        return f"rank {rank} crashed ({outcome.crash.signal_name})" + (f" at {frame}" if frame else "")
    return f"rank {rank} raised {outcome.raised}"


def _join(ranks):
    return ", ".join(str(rank) for rank in ranks)


__all__ = ["AcrossRanks", "Layout", "RanksDisagree", "RanksFailed"]
