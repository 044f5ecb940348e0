"""Selection ops on integer-valued data, where ties are everywhere: a correct top-k and a planted-bug twin.

Vote counts, token counts and quantised scores are small integers, so every
row of a top-k over them has ties. At a tie the selection flips under the
smallest change, and finite differences measure another selection than the
one backward differentiates; a correct op must still pass every check.

* :class:`TopK` -- ``torch.topk`` along the last dim, returning values and
  indices; backward scatters ``grad_values`` to the selected indices:
  values, indices and gradients bit-identical to ``torch.topk``'s.
* :class:`TopKReversedGradient` -- BUG: scatters the gradients in reverse
  order (the largest value's gradient goes to the k-th largest element),
  wrong away from any tie.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

__all__ = ["TopK", "TopKReversedGradient", "topk_reference", "votes", "topk_samples"]


class TopK(Function):
    """``torch.topk(x, k, dim=-1)``: (values, indices); the gradient of each value goes to its index."""

    reverse = False

    @staticmethod
    def forward(ctx, x, k):
        values, indices = torch.topk(x, k, dim=-1)
        ctx.save_for_backward(indices)
        ctx.shape = x.shape
        ctx.mark_non_differentiable(indices)
        return values, indices

    @classmethod
    def backward(cls, ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        if cls.reverse:
            indices = indices.flip(-1)
        grad = torch.zeros(ctx.shape, dtype=grad_values.dtype, device=grad_values.device)
        return grad.scatter(-1, indices, grad_values), None


class TopKReversedGradient(TopK):
    """BUG: the gradient of the i-th largest value goes to the (k - 1 - i)-th largest element."""

    reverse = True


def topk_reference(x, k):
    return torch.topk(x, k, dim=-1)


def votes(*shape, generator=None, high=5, dtype=torch.float32):
    """Integer vote counts in [0, high): with more columns than ``high``, every row has ties."""
    return torch.randint(0, high, shape, generator=generator).to(dtype)


def topk_samples(generator=None, dtype=torch.float32):
    """Rows of 10 votes in [0, 5), and a batch of 4 x 3 such rows: every row ties, also across the k boundary."""
    return [(votes(6, 10, generator=generator, dtype=dtype), 3), (votes(4, 3, 10, generator=generator, dtype=dtype), 4)]
