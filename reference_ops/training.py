"""Ops that are right when called plainly and wrong only where a training step calls them, with correct twins.

Activation checkpointing (the checkpoint check):

* :class:`CountsCalls` -- correct; counts its calls on the class, a statistic nothing reads.
* :class:`DropoutOwnGenerator` -- draws its mask from a ``torch.Generator`` of its own, which checkpoint
  does not restore: the recompute draws another mask. Its correct twin is
  :class:`reference_ops.random_ops.Dropout`, on torch's global generator.
* :class:`NoiseFromNumpy` -- multiplicative noise from numpy's global generator: recomputed otherwise.
* :class:`AnnealedByStepCount` -- a temperature annealed by a step counter forward advances on every
  differentiated call: the recompute is one step later.
* :class:`TokenDropOwnGenerator` -- drops random rows (its own generator) and saves the kept rows' indices:
  the recompute saves another number of them, and torch's recompute check raises.

Saved-tensor hooks, offloading (the offload check):

* :class:`PackedQKV` -- correct; ``q * k + v`` of a packed ``qkv``, saving the whole ``qkv``.
* :class:`PackedQKVReadsPastItsView` -- saves only the view ``q`` and reaches ``k`` in backward through
  ``q``'s storage (as a kernel given ``q``'s pointer would): a copy of ``q`` has nothing past it.
* :class:`ScaledDropout` -- correct; dropout whose scale is applied in forward.
* :class:`ScaledDropoutFinishesMaskInBackward` -- scales its saved mask in place in backward through an
  alias kept on ctx, then reads it through ``ctx.saved_tensors``: a copy never sees the change.

Gradient accumulation over micro-batches (the accumulation check):

* :class:`ScaleColumns` -- correct; ``x * w`` with ``w`` one scale per column, gradients in new tensors.
* :class:`ScaleColumnsGradIntoBufferView` -- writes ``w``'s gradient into a buffer kept on the class and
  returns a view of it: torch keeps the view as ``.grad``, and the next backward overwrites it.
* :class:`ScaleColumnsReturnsGradBuffer` -- returns the buffer itself: ``.grad`` is a copy, but a gradient
  returned by ``torch.autograd.grad`` changes when the next backward runs.

Overflowing loss scales (the overflow check):

* :class:`ReLUWhere` -- correct; ``relu`` whose backward selects with ``torch.where``: where it drops
  ``grad_output`` it gives 0, not ``inf * 0 = NaN`` as ``grad * mask`` (and a reference in torch ops) would.
* :class:`ScaleColumnsClampsGradOutput` -- clamps ``grad_output`` to the float16 range: an inf becomes 65504.
* :class:`ScaleColumnsZeroesNonFiniteGradOutput` -- ``nan_to_num(grad, 0, 0, 0)``: inf and NaN become 0.
* :class:`ScaleColumnsMasksNonFiniteGradOutput` -- ``where(isfinite(grad), grad, 0)``.
* :class:`ScaleColumnsSaturatesGradOutput` -- float8-style saturation with ``fmax``/``fmin``: NaN dropped,
  inf saturated to 448.

torch.autocast (the autocast check; the decorated ones are for the CPU's autocast, device_type="cpu"):

* :class:`LinearAutocast` -- correct; ``@torch.amp.custom_fwd`` on forward, ``@torch.amp.custom_bwd`` on backward.
* :class:`LinearWithoutCustomFwd` -- neither: forward saves float32 tensors and returns bfloat16, and backward's
  ``grad_output @ weight`` raises a dtype mismatch.
* :class:`LinearCustomFwdWithoutCustomBwd` -- forward decorated, backward not: backward runs without autocast.
* :class:`LinearInFloat32` -- correct; ``custom_fwd(cast_inputs=torch.float32)``: float32 output by design.
* :class:`LinearThenNorm` -- correct; a linear layer then a layer norm whose statistics are float32.
* :class:`LinearThenNormOnePassVariance` -- the statistics in the activation dtype, ``E[h^2] - E[h]^2``: in
  bfloat16 the variance cancels away, where ``torch.nn.functional.layer_norm`` under autocast keeps it.
* :class:`Float32OnlyKernel` -- a kernel that refuses any dtype but float32, as autocast's matmul hands it
  bfloat16: noted, not failed.

``samples(generator)`` gives the samples of every op here but the packed ones (``qkv_samples``): one ``x``
of shape ``(6, 8)``; ``columns_samples`` those of the ScaleColumns ops, ``linear_samples`` and ``norm_samples``
those of the linear ones (``linear_then_norm`` is the reference of the norm ones).
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = [
    "AnnealedByStepCount",
    "CountsCalls",
    "Float32OnlyKernel",
    "LinearAutocast",
    "LinearCustomFwdWithoutCustomBwd",
    "LinearInFloat32",
    "LinearThenNorm",
    "LinearThenNormOnePassVariance",
    "LinearWithoutCustomFwd",
    "DropoutOwnGenerator",
    "NoiseFromNumpy",
    "PackedQKV",
    "PackedQKVReadsPastItsView",
    "ScaledDropout",
    "ReLUWhere",
    "ScaleColumns",
    "ScaleColumnsClampsGradOutput",
    "ScaleColumnsGradIntoBufferView",
    "ScaleColumnsMasksNonFiniteGradOutput",
    "ScaleColumnsReturnsGradBuffer",
    "ScaleColumnsSaturatesGradOutput",
    "ScaleColumnsZeroesNonFiniteGradOutput",
    "ScaledDropoutFinishesMaskInBackward",
    "TokenDropOwnGenerator",
    "columns_samples",
    "linear_samples",
    "linear_then_norm",
    "norm_samples",
    "qkv_samples",
    "relu_by_mask",
    "samples",
]


def samples(generator=None):
    return [(torch.randn(6, 8, generator=generator),)]


def columns_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator), torch.randn(8, generator=generator))]


def linear_samples(generator=None):
    return [(torch.randn(6, 8, generator=generator), torch.randn(5, 8, generator=generator))]


def norm_samples(generator=None):
    """Activations with a large common offset, as after a linear layer with a bias: the variance is small beside
    the mean square."""
    x, w = torch.randn(6, 64, generator=generator), torch.randn(32, 64, generator=generator) / 8
    return [(x, w, 12 + torch.randn(32, generator=generator))]


def qkv_samples(generator=None):
    return [(torch.randn(6, 3 * 4, generator=generator),)]


# ---------------------------------------------------------------------------
# Activation checkpointing
# ---------------------------------------------------------------------------


class CountsCalls(Function):
    """``x * tanh(x)``; every call adds one to a counter on the class that nothing reads: a harmless side effect."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        CountsCalls.calls += 1
        ctx.save_for_backward(x)
        return x * torch.tanh(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        t = torch.tanh(x)
        return grad * (t + x * (1 - t * t))


class DropoutOwnGenerator(Function):
    """Bug under checkpoint: dropout with its mask from a generator of its own, saved for backward. Correct plainly;
    recomputed under checkpoint, it draws another mask, and backward uses that one."""

    generator = torch.Generator().manual_seed(0)
    p = 0.3

    @staticmethod
    def forward(ctx, x):
        keep = torch.rand(x.shape, generator=DropoutOwnGenerator.generator, dtype=torch.float32, device=x.device)
        keep = (keep >= DropoutOwnGenerator.p).to(x.dtype) / (1 - DropoutOwnGenerator.p)
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep


class NoiseFromNumpy(Function):
    """Bug under checkpoint: ``x * (1 + 0.1 * eps)`` with ``eps`` from numpy's global generator, saved for backward."""

    @staticmethod
    def forward(ctx, x):
        import numpy

        scale = 1 + 0.1 * torch.from_numpy(numpy.random.standard_normal(tuple(x.shape))).to(x.device, x.dtype)
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale


class AnnealedByStepCount(Function):
    """Bug under checkpoint: ``softmax(x / tau)`` with ``tau`` annealed by a step counter that forward advances on
    every call that will be differentiated. Correct plainly (each call uses the tau it saved); the recompute under
    checkpoint advances the counter again and computes with the next tau."""

    step = 0

    @staticmethod
    def forward(ctx, x):
        if any(ctx.needs_input_grad):
            AnnealedByStepCount.step += 1
        tau = 1.0 + 1.0 / (1 + AnnealedByStepCount.step % 7)
        y = torch.softmax(x / tau, -1)
        ctx.tau = tau
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True)) / ctx.tau


class TokenDropOwnGenerator(Function):
    """Bug under checkpoint: drops random rows of ``x`` (a generator of its own) and saves the kept rows' indices;
    the recompute keeps another number of rows, and torch's recompute check raises a CheckpointError."""

    generator = torch.Generator().manual_seed(1)

    @staticmethod
    def forward(ctx, x):
        keep = torch.rand(x.shape[0], generator=TokenDropOwnGenerator.generator) >= 0.5
        kept = keep.nonzero().squeeze(1).to(x.device)
        ctx.save_for_backward(kept)
        ctx.rows = x.shape[0]
        out = torch.zeros_like(x)
        out[kept] = x[kept]
        return out

    @staticmethod
    def backward(ctx, grad):
        (kept,) = ctx.saved_tensors
        out = torch.zeros_like(grad)
        out[kept] = grad[kept]
        return out


# ---------------------------------------------------------------------------
# Saved-tensor hooks, offloading
# ---------------------------------------------------------------------------


class PackedQKV(Function):
    """``q * k + v`` with ``q, k, v`` the thirds of the last dim of ``qkv``; saves ``qkv`` itself."""

    @staticmethod
    def forward(ctx, qkv):
        q, k, v = qkv.chunk(3, -1)
        ctx.save_for_backward(qkv)
        return q * k + v

    @staticmethod
    def backward(ctx, grad):
        (qkv,) = ctx.saved_tensors
        q, k, _ = qkv.chunk(3, -1)
        return torch.cat([grad * k, grad * q, grad], -1)


class PackedQKVReadsPastItsView(PackedQKV):
    """Bug under offloading: saves the view ``q`` alone and finds ``k`` ``d`` elements after it in ``q``'s storage,
    rows ``3 d`` apart, as a kernel handed ``q``'s pointer would. Plainly ``q`` is a view of ``qkv``; a copy of it
    (save_on_cpu, any saved-tensor hooks) has no ``k`` after it."""

    @staticmethod
    def forward(ctx, qkv):
        q, k, v = qkv.chunk(3, -1)
        ctx.save_for_backward(q)
        return q * k + v

    @staticmethod
    def backward(ctx, grad):
        (q,) = ctx.saved_tensors
        d = q.shape[-1]
        k = q.as_strided(q.shape, (3 * d, 1), q.storage_offset() + d)
        return torch.cat([grad * k, grad * q, grad], -1)


class ScaledDropout(Function):
    """Dropout (torch's global generator) with the mask scaled by ``1 / (1 - p)`` in forward, saved for backward."""

    p = 0.25

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) >= ScaledDropout.p).to(x.dtype) / (1 - ScaledDropout.p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask


class ScaledDropoutFinishesMaskInBackward(ScaledDropout):
    """Bug under offloading: saves the unscaled mask, keeps its memory on ctx too, and in backward scales it in
    place through that alias (as a kernel writing through a pointer does, unseen by torch's version counter) before
    reading it through ``ctx.saved_tensors``. Plainly both are one memory; a saved copy never sees the scaling."""

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) >= ScaledDropout.p).to(x.dtype)
        ctx.save_for_backward(mask)
        ctx.mask_memory = mask.data
        return x * mask / (1 - ScaledDropout.p)

    @staticmethod
    def backward(ctx, grad):
        ctx.mask_memory.div_(1 - ScaledDropout.p)
        (mask,) = ctx.saved_tensors
        return grad * mask


# ---------------------------------------------------------------------------
# Gradient accumulation
# ---------------------------------------------------------------------------


class ScaleColumns(Function):
    """``x * w``, ``w`` one scale per column of ``x``: ``w``'s gradient is the column sums of ``grad * x``."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad * w, (grad * x).sum(0)


class ScaleColumnsGradIntoBufferView(ScaleColumns):
    """Bug under accumulation: ``w``'s gradient is written into a buffer kept on the class (no allocation per call)
    and a view of it is returned. Nothing else holds the view, so torch keeps it as ``w.grad``; the next
    micro-batch's backward writes its own gradient into the buffer, then torch adds that into ``w.grad``: twice the
    second gradient, the first one lost."""

    buffer = None

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        cls = ScaleColumnsGradIntoBufferView
        if cls.buffer is None or cls.buffer.shape != (w.numel(),) or cls.buffer.dtype != w.dtype:
            cls.buffer = torch.empty(w.numel(), dtype=w.dtype, device=w.device)
        torch.sum(grad * x, 0, out=cls.buffer)
        return grad * w, cls.buffer.view(w.shape)


class ScaleColumnsReturnsGradBuffer(ScaleColumns):
    """Bug under accumulation: returns the buffer kept on the class itself as ``w``'s gradient. torch copies it
    into ``.grad`` (the class still holds it), but a gradient returned by ``torch.autograd.grad`` is that buffer,
    and the next backward overwrites it."""

    buffer = None

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        cls = ScaleColumnsReturnsGradBuffer
        if cls.buffer is None or cls.buffer.shape != w.shape or cls.buffer.dtype != w.dtype:
            cls.buffer = torch.empty_like(w)
        torch.sum(grad * x, 0, out=cls.buffer)
        return grad * w, cls.buffer


# ---------------------------------------------------------------------------
# Overflowing loss scales
# ---------------------------------------------------------------------------


class ReLUWhere(Function):
    """``relu(x)``; backward keeps ``grad_output`` where ``x > 0`` and puts 0 elsewhere, with ``torch.where``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, grad, torch.zeros_like(grad))


def relu_by_mask(x):
    """relu in torch ops, as a reference: its gradient is ``grad * mask``, NaN where an inf meets the mask's 0."""
    return x * (x > 0).to(x.dtype)


class ScaleColumnsClampsGradOutput(ScaleColumns):
    """Bug under an overflowing loss scale: clamps ``grad_output`` to the float16 range first."""

    @staticmethod
    def backward(ctx, grad):
        return ScaleColumns.backward(ctx, grad.clamp(-65504.0, 65504.0))


class ScaleColumnsZeroesNonFiniteGradOutput(ScaleColumns):
    """Bug under an overflowing loss scale: replaces inf and NaN in ``grad_output`` with 0."""

    @staticmethod
    def backward(ctx, grad):
        return ScaleColumns.backward(ctx, torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0))


class ScaleColumnsMasksNonFiniteGradOutput(ScaleColumns):
    """Bug under an overflowing loss scale: keeps only the finite elements of ``grad_output``."""

    @staticmethod
    def backward(ctx, grad):
        return ScaleColumns.backward(ctx, torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad)))


class ScaleColumnsSaturatesGradOutput(ScaleColumns):
    """Bug under an overflowing loss scale: saturates ``grad_output`` to float8 e4m3's range with ``fmax``/``fmin``,
    which drop NaN: NaN becomes -448, inf 448."""

    @staticmethod
    def backward(ctx, grad):
        return ScaleColumns.backward(ctx, torch.fmin(torch.fmax(grad, torch.tensor(-448.0, dtype=grad.dtype)),
                                                     torch.tensor(448.0, dtype=grad.dtype)))


# ---------------------------------------------------------------------------
# torch.autocast
# ---------------------------------------------------------------------------


class LinearWithoutCustomFwd(Function):
    """Bug under autocast: ``x @ w.T`` without ``custom_fwd``/``custom_bwd``. Forward's matmul returns bfloat16
    under autocast while ``w`` is saved in float32; backward runs outside autocast, and ``grad @ w`` raises."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.T @ x


class LinearAutocast(LinearWithoutCustomFwd):
    """``x @ w.T`` with ``custom_fwd``/``custom_bwd``: backward runs under the autocast state forward ran in."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.T @ x


class LinearCustomFwdWithoutCustomBwd(LinearWithoutCustomFwd):
    """Bug under autocast: forward is ``custom_fwd``, backward is not, so backward runs without autocast on a
    bfloat16 ``grad`` and float32 saved tensors."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.T


class LinearInFloat32(LinearWithoutCustomFwd):
    """``x @ w.T`` in float32 under autocast on purpose (``cast_inputs=torch.float32``): its output stays float32
    where ``torch.nn.functional.linear``'s is bfloat16."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.T @ x


def linear_then_norm(x, w, b):
    """The reference of the norm ops: torch's linear layer, then torch's layer norm (without affine)."""
    return torch.nn.functional.layer_norm(torch.nn.functional.linear(x, w, b), (w.shape[0],))


def _norm_statistics_in_float32(h):
    h32 = h.float()
    mean = h32.mean(-1, keepdim=True)
    var = ((h32 - mean) ** 2).mean(-1, keepdim=True)
    return ((h32 - mean) * torch.rsqrt(var + 1e-5)).to(h.dtype)


def LinearThenNorm(x, w, b):  # noqa: N802 - named like the Function twins it stands beside
    """A linear layer then a layer norm whose statistics are computed in float32 whatever the activation dtype."""
    return _norm_statistics_in_float32(x @ w.T + b)


def LinearThenNormOnePassVariance(x, w, b):  # noqa: N802
    """Bug under autocast: the layer norm's statistics in the activation dtype, the variance as E[h^2] - E[h]^2.
    In float32 that is fine; under autocast ``h`` is bfloat16 and the variance of activations with a large mean
    cancels away, where torch's layer norm keeps it."""
    h = torch.nn.functional.linear(x, w, b)
    mean = h.mean(-1, keepdim=True)
    var = (h * h).mean(-1, keepdim=True) - mean * mean
    return (h - mean) * torch.rsqrt(var.clamp(min=0) + 1e-5)


class Float32OnlyKernel(Function):
    """``tanh(x @ w.T)`` through a kernel that takes float32 only: under autocast the matmul hands it bfloat16, and it
    refuses (a context it cannot run in: noted, not failed)."""

    @staticmethod
    def forward(ctx, x, w):
        h = x @ w.T
        if h.dtype != torch.float32:
            raise TypeError(f"tanh kernel: expected float32 tensors, got {h.dtype}")
        y = torch.tanh(h)
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, w, y = ctx.saved_tensors
        g = grad * (1 - y * y)
        return g @ w, g.T @ x
