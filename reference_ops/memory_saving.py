"""A backward that writes the gradients into the inputs forward saved, to save memory, as Liger's kernels do.

``SwiGLUSavesMemory`` computes ``silu(a) * b``; its backward overwrites the
saved ``a`` and ``b`` with their gradients and returns them. That is by
design: declared with ``mutates=("a", "b")`` on the marker it passes every
default check (the mutation check reports it otherwise, naming ``mutates=``).
``SwiGLUSavesMemoryNoSiluTerm`` makes the same writes with a wrong gradient
(it forgets the derivative of the sigmoid inside silu): gradcheck must name
``a`` for the gradient itself, not for the writes.

``SwiGLUSavesMemoryKernelStyle`` writes the same gradients the way a Triton
or CUDA kernel does, through the raw memory (``.data``): no version counter
moves, so torch does not refuse a second backward on the same graph, which
then reads the first one's gradients as its inputs. The checks must still
judge the gradient.
"""

import torch
from torch.autograd import Function

__all__ = ["SwiGLUSavesMemory", "SwiGLUSavesMemoryKernelStyle", "SwiGLUSavesMemoryNoSiluTerm", "swiglu_reference",
           "swiglu_samples"]


class SwiGLUSavesMemory(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        sigmoid = torch.sigmoid(a)
        silu = a * sigmoid
        grad_b = grad * silu
        a.copy_(grad * b * (sigmoid + silu * (1 - sigmoid)))  # the input's memory now holds its gradient
        b.copy_(grad_b)
        return a, b


class SwiGLUSavesMemoryNoSiluTerm(SwiGLUSavesMemory):
    """Bug: d silu / da taken as sigmoid(a), without the term from the sigmoid's own derivative."""

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        sigmoid = torch.sigmoid(a)
        grad_b = grad * a * sigmoid
        a.copy_(grad * b * sigmoid)
        b.copy_(grad_b)
        return a, b


class SwiGLUSavesMemoryKernelStyle(SwiGLUSavesMemory):
    """The same gradients written through the raw memory, as a kernel writes them: no version counter moves."""

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        sigmoid = torch.sigmoid(a)
        silu = a * sigmoid
        grad_a = grad * b * (sigmoid + silu * (1 - sigmoid))
        b.data.copy_(grad * silu)
        a.data.copy_(grad_a)
        return a, b


def swiglu_reference(a, b):
    return torch.nn.functional.silu(a) * b


def swiglu_samples(generator=None):
    return [(torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator))]
