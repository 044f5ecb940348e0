"""Ops for the extreme check: saturating, exp-domain, normalising and loss ops, with their twins.

Correct ops (each with a reference, and samples) must pass every default
check at every magnitude the extreme check tries:

* :class:`Softplus`, :class:`Tanh`, :class:`Sigmoid`, :class:`Log1p`,
  :class:`Exp`, :class:`LogSumExp`, :class:`LayerNorm`, :class:`CrossEntropy`;
* :class:`RowSoftplus`, whose row indices arrive as a float tensor (as RoI
  boxes carry their batch index) declared ``constants=``: scaling them
  would index out of range;
* :func:`euler_decay`, a fixed-step solver whose step count grows with the
  time span: at a span of 2e9 it would run for hours;
* :class:`TabulatedTanh`, defined (like its reference) only for |x| <= 100.

Planted bugs: :class:`SoftplusShortcut` and :class:`RowSoftplusShortcut`,
whose backward returns 0 for |x| > 4 where the true derivative is about 1:
finite, and wrong.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd import Function

__all__ = [
    "EDGE_OPS",
    "CrossEntropy",
    "EdgeOp",
    "Exp",
    "LayerNorm",
    "Log1p",
    "LogSumExp",
    "RowSoftplus",
    "RowSoftplusShortcut",
    "Sigmoid",
    "Softplus",
    "SoftplusShortcut",
    "TabulatedTanh",
    "Tanh",
    "euler_decay",
    "euler_decay_reference",
    "tabulated_tanh_reference",
]

SHORTCUT = 4.0


class Softplus(Function):
    """log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): no overflow in any dtype; derivative sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


class SoftplusShortcut(Softplus):
    """Bug: backward returns 0 for |x| > 4 ("saturated"), where the derivative is ~1 (x > 4)."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.where(x.abs() > SHORTCUT, torch.zeros_like(x), grad * torch.sigmoid(x))


class Tanh(Function):
    """tanh, with backward from the saved output: 1 - y**2."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class Sigmoid(Function):
    """sigmoid, with backward from the saved output: y * (1 - y)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y * (1 - y)


class Log1p(Function):
    """log(1 + x) for x > -1; derivative 1 / (1 + x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / (1 + x)


class Exp(Function):
    """exp, with backward from the saved output."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class LogSumExp(Function):
    """logsumexp over the last dimension, max-subtracted; derivative softmax."""

    @staticmethod
    def forward(ctx, x):
        m = x.amax(-1, keepdim=True)
        ctx.save_for_backward(x)
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # softmax recomputed from x: backward stays differentiable
        return grad.unsqueeze(-1) * torch.softmax(x, -1)


class LayerNorm(Function):
    """Layer norm over the last dimension (no affine), eps inside the square root."""

    EPS = 1e-5

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return LayerNorm.normalise(x)[0]

    @staticmethod
    def normalise(x):
        centred = x - x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((centred * centred).mean(-1, keepdim=True) + LayerNorm.EPS)
        return centred * rstd, rstd

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors  # recomputed from x: backward stays differentiable
        y, rstd = LayerNorm.normalise(x)
        g_mean = grad.mean(-1, keepdim=True)
        gy_mean = (grad * y).mean(-1, keepdim=True)
        return rstd * (grad - g_mean - y * gy_mean)


def layer_norm_reference(x):
    return F.layer_norm(x, x.shape[-1:], eps=LayerNorm.EPS)


class CrossEntropy(Function):
    """Mean cross-entropy of logits against integer targets; derivative (softmax - one_hot) / N."""

    rows_from_dim_zero = False  # the planted bug of reference_ops.sizes.CrossEntropyDividesByShapeZero

    @staticmethod
    def forward(ctx, logits, target):
        log_probs = logits - torch.logsumexp(logits, -1, keepdim=True)
        ctx.save_for_backward(logits, target)
        return -log_probs.gather(-1, target.unsqueeze(-1)).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, target = ctx.saved_tensors
        one_hot = torch.zeros_like(logits).scatter_(-1, target.unsqueeze(-1), 1.0)
        rows = logits.numel() // logits.shape[-1]  # every leading dim: logits.shape[0] is right for 2-D logits only
        if getattr(ctx, "_forward_cls", CrossEntropy).rows_from_dim_zero:
            rows = logits.shape[0]
        return grad * (torch.softmax(logits, -1) - one_hot) / rows, None


class RowSoftplus(Function):
    """softplus of the rows of ``x`` picked by ``rows``, row indices stored as floats (like RoI batch indices)."""

    @staticmethod
    def forward(ctx, x, rows):
        index = rows.long()
        ctx.save_for_backward(x, index)
        return F.softplus(x[index])

    @staticmethod
    def backward(ctx, grad):
        x, index = ctx.saved_tensors
        picked = x[index]
        return torch.zeros_like(x).index_add(0, index, grad * torch.sigmoid(picked)), None


class RowSoftplusShortcut(RowSoftplus):
    """Bug: the softplus derivative is taken as 0 for |x| > 4, where it is ~1 (x > 4)."""

    @staticmethod
    def backward(ctx, grad):
        x, index = ctx.saved_tensors
        picked = x[index]
        local = torch.where(picked.abs() > SHORTCUT, torch.zeros_like(picked), grad * torch.sigmoid(picked))
        return torch.zeros_like(x).index_add(0, index, local), None


def row_softplus_reference(x, rows):
    return F.softplus(x[rows.long()])


def euler_decay(y0, t, step=0.05):
    """y' = -y from 0 to ``t`` by explicit Euler steps of ``step``: the work grows with ``t``."""
    y, done = y0, torch.zeros_like(t)
    while bool((done < t).any()):
        h = (t - done).clamp(0, step)
        y = y * (1 - h)
        done = done + h
    return y


def euler_decay_reference(y0, t, step=0.05):
    """The same Euler scheme in closed form: every full step, then the last partial one."""
    full = torch.floor(t / step)
    return y0 * (1 - step) ** full * (1 - (t - full * step))


class TabulatedTanh(Function):
    """tanh from a table that covers |x| <= 100 only: it refuses larger inputs, as its reference does."""

    LIMIT = 100.0

    @staticmethod
    def forward(ctx, x):
        _refuse_outside_table(x)
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


def tabulated_tanh_reference(x):
    _refuse_outside_table(x)
    return torch.tanh(x)


def _refuse_outside_table(x):
    if bool((x.abs() > TabulatedTanh.LIMIT).any()):
        raise ValueError(f"the table covers |x| <= {TabulatedTanh.LIMIT:g} only")


# ---------------------------------------------------------------------------
# Samples and registry
# ---------------------------------------------------------------------------


def _randn(generator, *shape):
    return torch.randn(*shape, generator=generator)


def _rand(generator, *shape):
    return torch.rand(*shape, generator=generator)


def unit_samples(generator):
    return [(_randn(generator, 3, 5),), (_randn(generator, 7),)]


def positive_samples(generator):
    return [(_rand(generator, 3, 5) + 0.1,), (_rand(generator, 7) + 0.1,)]


def cross_entropy_samples(generator):
    return [(_randn(generator, 4, 5), torch.randint(0, 5, (4,), generator=generator))]


def row_samples(generator):
    x = _randn(generator, 3, 4)
    return [(x, torch.tensor([2.0, 0.0, 2.0, 1.0]))]


def decay_samples(generator):
    return [(_randn(generator, 4), _rand(generator, 4) + 0.5, 0.25)]


class EdgeOp(NamedTuple):
    """``(op, reference, samples, marker options)`` of one op for the extreme check."""

    op: object
    reference: object
    samples: object
    options: dict


EDGE_OPS = {
    "softplus": EdgeOp(Softplus, F.softplus, unit_samples, {}),
    "tanh": EdgeOp(Tanh, torch.tanh, unit_samples, {}),
    "sigmoid": EdgeOp(Sigmoid, torch.sigmoid, unit_samples, {}),
    "log1p": EdgeOp(Log1p, torch.log1p, positive_samples, {}),
    "exp": EdgeOp(Exp, torch.exp, unit_samples, {}),
    "logsumexp": EdgeOp(LogSumExp, lambda x: torch.logsumexp(x, -1), unit_samples, {}),
    "layer_norm": EdgeOp(LayerNorm, layer_norm_reference, unit_samples, {}),
    "cross_entropy": EdgeOp(CrossEntropy, F.cross_entropy, cross_entropy_samples, {}),
    "row_softplus": EdgeOp(RowSoftplus, row_softplus_reference, row_samples, {"constants": ("rows",)}),
    "euler_decay": EdgeOp(euler_decay, euler_decay_reference, decay_samples, {}),
    "tabulated_tanh": EdgeOp(TabulatedTanh, tabulated_tanh_reference, unit_samples, {}),
}
"""Correct ops: name -> ``EdgeOp``; each passes every default check."""

SHORTCUTS = {"softplus": SoftplusShortcut, "row_softplus": RowSoftplusShortcut}
"""Planted bugs: the name of the correct twin in :data:`EDGE_OPS` -> the buggy op."""
