"""Ops that talk across ranks, written as Megatron-style tensor and sequence parallel layers, with planted twins.

Each correct op is checked with ``world_size=`` and DTensor placements on the
marker (see docs/distributed.md); each twin plants one of the communication
bugs that train silently badly:

Mappings (``x`` is the activation; every rank holds the part its placement says):

* :class:`CopyToRegion` -- identity forward, all-reduce backward; twin
  :class:`CopyToRegionNoAllReduce` (the backward forgets the all-reduce).
* :class:`ReduceFromRegion` -- all-reduce forward, identity backward; twin
  :class:`ReduceFromRegionReducesGrad` (all-reduces the gradient again: the
  world size times too large).
* :class:`GatherFromRegion` -- all-gather of the last dim forward, split
  backward; twin :class:`GatherFromRegionWrongOrder` (ranks gathered in
  reverse order).

Layers:

* :class:`ColumnParallelLinear` -- ``x`` replicated, ``weight`` and ``bias``
  sharded along the output features, output sharded along its last dim;
  twin :class:`ColumnParallelLinearNoInputAllReduce` (the input's gradient is
  each rank's partial sum only).
* :class:`RowParallelLinear` -- ``x`` sharded along its last dim, ``weight``
  along its input features, ``bias`` replicated and added after the
  all-reduce; twin :class:`RowParallelLinearBiasOnEveryRank` (the bias added
  on every rank before the reduction).
* :class:`VocabParallelCrossEntropy` -- logits sharded along the vocabulary,
  one loss per row; twin :class:`VocabParallelCrossEntropyLocalMax` (each rank
  subtracts its own max, not the global one, in backward).
* :class:`SequenceParallelLayerNorm` -- rows sharded along the sequence,
  ``weight`` and ``bias`` replicated, their gradients all-reduced; twin
  :class:`SequenceParallelLayerNormNoWeightAllReduce` (each rank keeps its own
  partial weight gradient).
* :class:`AllToAllDispatch` -- tokens sharded along dim 0, each rank sends
  equal slices to every rank (expert parallel dispatch); twin
  :class:`AllToAllDispatchNoBackwardExchange` (the backward returns the
  received gradient without sending it back).

Other ways of talking across ranks:

* :class:`ReduceFromRegionFunctional` -- the all-reduce through
  ``torch.distributed._functional_collectives``; twin
  :class:`ReduceFromRegionFunctionalReducesGrad`.
* :func:`dtensor_linear` -- ``F.linear`` on DTensors (``dtensors=True`` on the
  marker), DTensor's rules running the collectives.
* :func:`column_linear_on_local_shards` -- a column-parallel linear written on
  the DTensors' local shards; twin
  :func:`column_linear_on_local_shards_without_partial_grad` (``x.to_local()``
  without ``grad_placements=[Partial()]``: the ranks keep different partial
  gradients of the replicated ``x``).
"""

import torch
import torch.distributed as dist


def _world():
    return dist.get_world_size(), dist.get_rank()


def _all_gather_last(x):
    world, _ = _world()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def _split_last(x):
    world, rank = _world()
    return x.chunk(world, dim=-1)[rank].contiguous()


class CopyToRegion(torch.autograd.Function):
    """Identity; backward all-reduces (the input is replicated, the layers after it sharded)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CopyToRegionNoAllReduce(CopyToRegion):
    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


class ReduceFromRegion(torch.autograd.Function):
    """All-reduce of the ranks' partial sums; backward passes the (replicated) gradient through."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


class ReduceFromRegionReducesGrad(ReduceFromRegion):
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class GatherFromRegion(torch.autograd.Function):
    """All-gather along the last dim; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x):
        return _all_gather_last(x)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad)


class GatherFromRegionWrongOrder(GatherFromRegion):
    @staticmethod
    def forward(ctx, x):
        world, _ = _world()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts[::-1], dim=-1)


class ColumnParallelLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` with the output features split over the ranks: the input's gradient is the sum of
    the ranks' parts."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight
        dist.all_reduce(grad_x)
        return grad_x, grad.t() @ x, grad.sum(0)


class ColumnParallelLinearNoInputAllReduce(ColumnParallelLinear):
    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, grad.sum(0)


class RowParallelLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` with the input features split over the ranks: the partial products are all-reduced,
    then the (replicated) bias added once."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        partial = x @ weight.t()
        dist.all_reduce(partial)
        return partial + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, grad.sum(0)


class RowParallelLinearBiasOnEveryRank(RowParallelLinear):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        partial = x @ weight.t() + bias
        dist.all_reduce(partial)
        return partial


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy per row over a vocabulary split across the ranks (Megatron's vocab-parallel loss)."""

    @staticmethod
    def forward(ctx, logits, target):
        world, rank = _world()
        start = rank * logits.shape[-1]
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)
        local = (target >= start) & (target < start + logits.shape[-1])
        picked = torch.where(local, shifted.gather(-1, (target - start).clamp(0, logits.shape[-1] - 1).unsqueeze(
            -1)).squeeze(-1), torch.zeros_like(top))
        dist.all_reduce(picked)
        total = shifted.exp().sum(dim=-1)
        dist.all_reduce(total)
        ctx.save_for_backward(shifted, total, target)
        ctx.start = start
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        shifted, total, target = ctx.saved_tensors
        softmax = shifted.exp() / total.unsqueeze(-1)
        local = (target >= ctx.start) & (target < ctx.start + shifted.shape[-1])
        index = (target - ctx.start).clamp(0, shifted.shape[-1] - 1)
        one_hot = torch.zeros_like(softmax).scatter(-1, index.unsqueeze(-1), 1.0) * local.unsqueeze(-1)
        return (softmax - one_hot) * grad.unsqueeze(-1), None


class VocabParallelCrossEntropyLocalMax(VocabParallelCrossEntropy):
    @staticmethod
    def backward(ctx, grad):
        shifted, total, target = ctx.saved_tensors
        local_max = shifted.max(dim=-1, keepdim=True).values
        softmax = (shifted - local_max).exp() / total.unsqueeze(-1)
        local = (target >= ctx.start) & (target < ctx.start + shifted.shape[-1])
        index = (target - ctx.start).clamp(0, shifted.shape[-1] - 1)
        one_hot = torch.zeros_like(softmax).scatter(-1, index.unsqueeze(-1), 1.0) * local.unsqueeze(-1)
        return (softmax - one_hot) * grad.unsqueeze(-1), None


class SequenceParallelLayerNorm(torch.autograd.Function):
    """Layer norm of rows sharded along the sequence; the replicated weight's and bias's gradients are all-reduced
    (every rank saw only its rows)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        mean = x.mean(-1, keepdim=True)
        rstd = (x.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
        normed = (x - mean) * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight + bias

    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        grad_normed = grad * weight
        grad_x = rstd * (grad_normed - grad_normed.mean(-1, keepdim=True)
                         - normed * (grad_normed * normed).mean(-1, keepdim=True))
        grad_weight = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
        dist.all_reduce(grad_weight)
        dist.all_reduce(grad_bias)
        return grad_x, grad_weight, grad_bias


class SequenceParallelLayerNormNoWeightAllReduce(SequenceParallelLayerNorm):
    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        grad_normed = grad * weight
        grad_x = rstd * (grad_normed - grad_normed.mean(-1, keepdim=True)
                         - normed * (grad_normed * normed).mean(-1, keepdim=True))
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
        dist.all_reduce(grad_bias)
        return grad_x, (grad * normed).reshape(-1, normed.shape[-1]).sum(0), grad_bias


class AllToAllDispatch(torch.autograd.Function):
    """Each rank's tokens (sharded along dim 0) split into ``world_size`` equal slices, slice ``r`` sent to rank
    ``r``: the tokens each expert's rank receives; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, tokens):
        return _exchange(tokens)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad)


class AllToAllDispatchNoBackwardExchange(AllToAllDispatch):
    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def _exchange(tokens):
    world, _ = _world()
    received = torch.empty_like(tokens.contiguous())
    dist.all_to_all_single(received, tokens.contiguous())
    del world
    return received


# --- Functional collectives (the traceable ones torch.compile sees) -------------------------------------------------

class ReduceFromRegionFunctional(ReduceFromRegion):
    """:class:`ReduceFromRegion` on ``torch.distributed._functional_collectives``: the all-reduce returns a new
    tensor instead of writing into its argument."""

    @staticmethod
    def forward(ctx, x):
        from torch.distributed import _functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))


class ReduceFromRegionFunctionalReducesGrad(ReduceFromRegionFunctional):
    @staticmethod
    def backward(ctx, grad):
        from torch.distributed import _functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_reduce(grad, "sum", dist.group.WORLD))


# --- Ops on DTensors (checked with dtensors=True: their arguments arrive as DTensors) -------------------------------

def dtensor_linear(x, weight, bias):
    """``F.linear`` on DTensors: DTensor's own sharding rules place the output and run the collectives."""
    return torch.nn.functional.linear(x, weight, bias)


def column_linear_on_local_shards(x, weight, bias, grad_placements=True):
    """A column-parallel linear written on the DTensors' local shards: ``x`` (replicated) enters the local
    computation with ``to_local(grad_placements=[Partial()])``, so each rank's part of its gradient is summed."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    local_x = x.to_local(grad_placements=[Partial()]) if grad_placements else x.to_local()
    local = torch.nn.functional.linear(local_x, weight.to_local(), bias.to_local())
    return DTensor.from_local(local, weight.device_mesh, [Shard(local.dim() - 1)], run_check=False)


def column_linear_on_local_shards_without_partial_grad(x, weight, bias):
    """Bug: ``x.to_local()`` without ``grad_placements``: DTensor takes each rank's partial gradient of the
    replicated ``x`` for the whole one, and the ranks' gradients differ."""
    return column_linear_on_local_shards(x, weight, bias, grad_placements=False)
