"""Ops whose backward deliberately is not the derivative, and one that only runs with ``.backward()``.

* :class:`SignStraightThrough`: ``sign(x)`` forward, the straight-through
  estimator backward (gradient passed through where ``|x| <= 1``, zero
  outside). Its true derivative is zero almost everywhere: declared with
  ``surrogate_grad=True``, it passes every other check against
  :func:`sign_straight_through_reference`, which builds the same surrogate
  from torch ops. :class:`SignStraightThroughNoRange` forgets the range and
  passes the gradient everywhere: reference catches it.
* :func:`checkpointed_block`: ``tanh(x @ w)`` under
  ``torch.utils.checkpoint(use_reentrant=True)``, which refuses
  ``torch.autograd.grad``; the checks drive it with ``.backward()``.
"""

from __future__ import annotations

import torch
from torch.autograd import Function
from torch.utils.checkpoint import checkpoint

__all__ = [
    "SignStraightThrough",
    "SignStraightThroughNoRange",
    "sign_straight_through_reference",
    "sign_samples",
    "checkpointed_block",
    "block_reference",
    "block_samples",
]


class SignStraightThrough(Function):
    """``sign(x)``; backward: the straight-through estimator, ``grad * (|x| <= 1)``."""

    limit = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sign(x)

    @classmethod
    def backward(cls, ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= cls.limit).to(grad.dtype)


class SignStraightThroughNoRange(SignStraightThrough):
    """BUG: passes the gradient through everywhere, ignoring the ``|x| <= 1`` range."""

    limit = float("inf")


def sign_straight_through_reference(x):
    """The same surrogate from torch ops: the value of sign, the gradient of hardtanh."""
    soft = torch.nn.functional.hardtanh(x)
    return torch.sign(x).detach() + soft - soft.detach()


def sign_samples(generator=None, dtype=torch.float32):
    """Values on both sides of 0 and of the range limits 1 and -1."""
    return [(2 * torch.randn(3, 5, generator=generator, dtype=dtype),)]


def _block(x, w):
    return torch.tanh(x @ w)


def checkpointed_block(x, w):
    """``tanh(x @ w)`` recomputed in backward by the reentrant checkpoint."""
    return checkpoint(_block, x, w, use_reentrant=True)


block_reference = _block


def block_samples(generator=None, dtype=torch.float32):
    return [(torch.randn(3, 4, generator=generator, dtype=dtype), torch.randn(4, 5, generator=generator, dtype=dtype))]
