"""What each rank runs: the op's forward on its local tensors (its graph kept for the backward that follows), and
that backward along its local incoming gradients."""

from collections import OrderedDict

KEPT_GRAPHS = 256  # at most this many graphs a rank keeps, newest last (the parent releases those it let go)
_GRAPHS = OrderedDict()  # call id -> (leaves, outputs)


def differentiable(args, kwargs):
    """The tensors that require grad among the top-level arguments, positional then keyword: the leaves, in the
    order both sides count them."""
    import torch

    return [value for value in list(args) + list(kwargs.values())
            if isinstance(value, torch.Tensor) and value.requires_grad]


def forward_on_rank(rank, op, call_id, args, kwargs, device_type, keep, released, as_dtensors=None):
    """The op on this rank's local arguments; its outputs, detached, in their flat order. ``keep``: whether the
    parent may take a backward of this call (its graph is kept until the parent lets go of the call:
    ``released``, the calls it let go of since its last task). ``as_dtensors``: for an op on DTensors, each
    argument's (placement, global shape) by slot and the outputs' placements: the local tensors are wrapped as
    DTensors for the op, and its DTensor outputs brought to those placements and unwrapped, differentiably."""
    import torch

    from pytest_autograd.engine.execution import flatten_outputs

    _release(released)
    op = _resolved(op)
    if device_type == "cuda":
        args, kwargs = _on(f"cuda:{torch.cuda.current_device()}", args, kwargs)
    leaves = differentiable(args, kwargs)
    with torch.set_grad_enabled(keep):
        function = op.apply if isinstance(op, type) and issubclass(op, torch.autograd.Function) else op
        if as_dtensors is None:
            outputs = flatten_outputs(function(*args, **kwargs))
        else:
            outputs = _on_dtensors(function, args, kwargs, device_type, *as_dtensors)
    if keep:
        _GRAPHS[call_id] = (leaves, outputs)
        while len(_GRAPHS) > KEPT_GRAPHS:
            _GRAPHS.popitem(last=False)
    return [output.detach() for output in outputs]


def backward_on_rank(rank, call_id, cotangents, released):
    """The local gradients of the forward ``call_id`` along ``cotangents`` (None for an input it does not reach);
    the graph is kept for another backward (gradcheck takes one per output element)."""
    from pytest_autograd.engine.backward_only import autograd_grad

    _release(released)
    leaves, outputs = _GRAPHS[call_id]
    pairs = [(output, cotangent.to(output.device)) for output, cotangent in zip(outputs, cotangents)
             if cotangent is not None and output.requires_grad]
    if not pairs or not leaves:
        return [None for _ in leaves]
    grads = autograd_grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True, retain_graph=True)
    return [None if grad is None else grad.detach() for grad in grads]


def _on_dtensors(function, args, kwargs, device_type, inputs, outputs):
    """``function`` called with DTensors made of the local arguments; its outputs as local tensors under
    ``outputs``' placements (a DTensor output redistributed there first, a plain tensor as it is)."""
    import torch

    from pytest_autograd.engine.execution import flatten_outputs

    DTensor = dtensor_api()["DTensor"]
    mesh = _mesh(device_type)

    def wrapped(slot, value):
        if slot not in inputs or not isinstance(value, torch.Tensor):
            return value
        placement, shape = inputs[slot]
        return DTensor.from_local(value, mesh, [_torch_placement(placement, len(shape))], run_check=False,
                                  shape=torch.Size(shape),
                                  stride=_contiguous_strides(shape))

    results = flatten_outputs(function(*[wrapped(slot, value) for slot, value in enumerate(args)],
                                       **{key: wrapped(key, value) for key, value in kwargs.items()}))
    local = []
    for index, result in enumerate(results):
        if isinstance(result, DTensor):
            wanted = [_torch_placement(outputs[min(index, len(outputs) - 1)], result.dim())]
            if list(result.placements) != wanted:
                result = result.redistribute(mesh, wanted)
            result = result.to_local()
        local.append(result)
    return local


_MESHES = {}


def _mesh(device_type):
    """This rank's 1-D device mesh over the whole world, made once."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if device_type not in _MESHES:
        _MESHES[device_type] = init_device_mesh(device_type, (dist.get_world_size(),))
    return _MESHES[device_type]


def dtensor_api():
    """DTensor and its placements: public since torch 2.5 (``torch.distributed.tensor``), before that in
    ``torch.distributed._tensor`` (``Partial`` then named ``_Partial``)."""
    try:
        from torch.distributed import tensor as api

        api.DTensor  # noqa: B018 - the public module, not an older namespace package
    except (ImportError, AttributeError):
        from torch.distributed import _tensor as api
    return {name: getattr(api, name, None) or getattr(api, "_" + name) for name in
            ("DTensor", "Partial", "Replicate", "Shard")}


def _torch_placement(placement, ndim):
    api = dtensor_api()
    if placement.kind == "Shard":
        return api["Shard"](placement.dim % ndim if ndim else 0)
    return api["Partial"]() if placement.kind == "Partial" else api["Replicate"]()


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _release(calls):
    for call in calls:
        _GRAPHS.pop(call, None)


def _resolved(op):
    from pytest_autograd.engine.processes.transport import FromTestMarker

    return op.resolve() if isinstance(op, FromTestMarker) else op


def _on(device, args, kwargs):
    import torch

    def moved(value):
        if not isinstance(value, torch.Tensor):
            return value
        leaf = value.detach().to(device)
        return leaf.requires_grad_(True) if value.requires_grad else leaf

    return [moved(value) for value in args], {key: moved(value) for key, value in kwargs.items()}
