"""Complex-valued Functions: a correct complex product and its conjugation-mistake twin.

torch's convention for complex autograd: backward receives the gradient of
a real loss w.r.t. the conjugate of the output and returns it w.r.t. the
conjugate of each input, so for ``z * w`` it is ``grad * w.conj()``.
Forgetting the ``.conj()`` is the classic complex backward bug: right for
real inputs, wrong in the imaginary part for complex ones.
"""

import torch
from torch.autograd import Function

__all__ = ["ComplexMul", "ComplexMulMissingConj", "complex_mul_samples"]


class ComplexMul(Function):
    """``z * w`` for complex tensors, backward ``grad * w.conj()`` and ``grad * z.conj()``."""

    @staticmethod
    def forward(ctx, z, w):
        ctx.save_for_backward(z, w)
        return z * w

    @staticmethod
    def backward(ctx, grad_output):
        z, w = ctx.saved_tensors
        return grad_output * w.conj(), grad_output * z.conj()


class ComplexMulMissingConj(Function):
    """Bug: backward returns ``grad * w`` and ``grad * z``, without conjugating."""

    @staticmethod
    def forward(ctx, z, w):
        ctx.save_for_backward(z, w)
        return z * w

    @staticmethod
    def backward(ctx, grad_output):
        z, w = ctx.saved_tensors
        return grad_output * w, grad_output * z


def complex_mul_samples(generator=None):
    def randn(*shape):
        return torch.randn(*shape, dtype=torch.complex64, generator=generator)

    return [(randn(3, 4), randn(3, 4)), (randn(5), randn(5))]
