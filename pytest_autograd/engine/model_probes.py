"""Two questions asked of a captured op before its checks: which dtype to judge it in, and whether its
backward is differentiable at all.

**The dtype.** The derivative checks judge an op in float64. Many kernels compute in
float32 whatever they are given (``x.float()`` ... ``.to(x.dtype)``, a
Triton kernel accumulating in float32) and return float64 for float64
inputs: in float64 their derivatives look wrong by float32 rounding, and
their gradients carry float32's fingerprint. For an op the model calls in
float32, bfloat16 or float16 that is how it is meant to work, not a bug:
such an op is judged in float32 instead, as if ``dtypes=`` declared it
(see docs/checks/low_precision_ops.md). An op the model calls in float64
is judged in float64, as usual.

The probe: one forward and backward in float64, on the captured values
moved off the float32 grid (by 2^-35 relative, below float32's resolution).
An op computing in float64 gives outputs and gradients off that grid too;
one computing in float32 rounds the inputs back onto it and returns float32
numbers only.

**The second derivative.** A model's training step takes first derivatives.
A backward written as a kernel (Triton, CUDA, numpy) returns gradients with
no graph behind them: double backward through it is not defined, whether or
not its author declared ``@once_differentiable``. For such an op the scan
declares ``double_backward=False`` (gradgradcheck skips it, saying why)
instead of failing the model for a second derivative it never takes. A
backward built from differentiable ops is judged by gradgradcheck as usual,
and a wrong second derivative fails.
"""

import torch

from pytest_autograd.engine.case import call_op
from pytest_autograd.engine.execution import as_dense

MIN_NONZERO = 4  # non-zero values needed before the float32 fingerprint counts
OFF_GRID = 2.0 ** -35


def float32_compute_reason(op, sample, differentiated, seed=0):
    """Why ``op`` computes in float32 on float64 inputs (forward or backward); None when it does not, or when
    the probe cannot tell (it raises, it returns nothing floating)."""
    generator = torch.Generator().manual_seed(seed)
    leaves = []

    def lift(slot, value):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        wide = value.detach().to(torch.float64)
        shift = torch.rand(wide.shape, generator=generator, dtype=torch.float64).to(wide.device) + 1.0
        wide = wide * (1.0 + OFF_GRID * shift)
        if slot in differentiated:
            wide.requires_grad_(True)
            leaves.append(wide)
        return wide

    args = [lift(slot, value) for slot, value in enumerate(sample.args)]
    kwargs = {name: lift(name, value) for name, value in sample.kwargs.items()}
    try:
        with torch.enable_grad():
            result = call_op(op, args, kwargs)
            outputs = [o for o in _tensors(result) if o.dtype == torch.float64]
            if not outputs:
                return None
            if all(_on_float32_grid(o) for o in outputs) and _enough(outputs):
                return "its float64 outputs are all exactly float32 numbers: it computes in float32"
            moving = [o for o in outputs if o.requires_grad]
            if not leaves or not moving:
                return None
            cotangents = [torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.device) for o in moving]
            grads = [as_dense(g) for g in torch.autograd.grad(moving, leaves, cotangents, allow_unused=True)
                     if g is not None]
    except Exception:  # the checks report an op that raises; the probe only asks how it computes
        return None
    grads = [g for g in grads if g.dtype == torch.float64]
    if grads and all(_on_float32_grid(g) for g in grads) and _enough(grads):
        return "its float64 gradients are all exactly float32 numbers: its backward computes in float32"
    return None


def _tensors(result):
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _on_float32_grid(tensor):
    values = tensor.detach()
    finite = values[torch.isfinite(values)]
    return bool((finite.to(torch.float32).to(torch.float64) == finite).all())


def _enough(tensors):
    return sum(int(torch.count_nonzero(t.detach())) for t in tensors) >= MIN_NONZERO


def backward_kernel_reason(op, sample, differentiated, seed=0):
    """Why ``op``'s backward is not differentiable at all (its gradients carry no graph, even with respect to
    grad_output); None when it is, or when the probe cannot tell."""
    generator = torch.Generator().manual_seed(seed)
    leaves = []

    def leaf(slot, value):
        if not isinstance(value, torch.Tensor) or slot not in differentiated or not value.is_floating_point():
            return value
        value = value.detach().clone().requires_grad_(True)
        leaves.append(value)
        return value

    args = [leaf(slot, value) for slot, value in enumerate(sample.args)]
    kwargs = {name: leaf(name, value) for name, value in sample.kwargs.items()}
    if not leaves:
        return None
    try:
        with torch.enable_grad():
            moving = [o for o in _tensors(call_op(op, args, kwargs)) if o.requires_grad]
            if not moving:
                return None
            cotangents = [torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.device, o.dtype)
                          .requires_grad_(True) for o in moving]
            grads = [as_dense(g) for g in torch.autograd.grad(moving, leaves, cotangents, allow_unused=True,
                                                              create_graph=True) if g is not None]
    except Exception:  # the checks report an op that raises
        return None
    if grads and not any(g.requires_grad for g in grads):
        return ("its backward returns gradients with no graph behind them (a kernel, or detached tensors), so it "
                "has no second derivative")
    return None


def judged_dtypes(captured):
    """The ``dtypes=`` for an op that computes in float32: float32, then the dtype the model called it in."""
    return tuple(dict.fromkeys([torch.float32, captured]))


def first_floating_dtype(sample):
    """The dtype of the sample's first floating tensor argument (None without one)."""
    for value in sample.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
    return None
