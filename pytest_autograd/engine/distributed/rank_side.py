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


def forward_on_rank(rank, op, call_id, args, kwargs, device_type, keep, released):
    """The op on this rank's local arguments; its outputs, detached, in their flat order. ``keep``: whether the
    parent may take a backward of this call (its graph is kept until the parent lets go of the call:
    ``released``, the calls it let go of since its last task)."""
    import torch

    from pytest_autograd.engine.execution import flatten_outputs

    _release(released)
    op = _resolved(op)
    if device_type == "cuda":
        args, kwargs = _on(f"cuda:{torch.cuda.current_device()}", args, kwargs)
    leaves = differentiable(args, kwargs)
    with torch.set_grad_enabled(keep):
        function = op.apply if isinstance(op, type) and issubclass(op, torch.autograd.Function) else op
        outputs = flatten_outputs(function(*args, **kwargs))
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
