"""A planted bug that only a GPU shows: the CUDA path differs from the CPU one.

Every check run on CPU passes :class:`LinearTailDroppedOnCuda` (its CPU path
is :class:`reference_ops.LinearFunction`, the correct twin); parity, and the
other checks run on ``cuda``, must fail it. ``benchmarks/gpu_report.py`` uses
it to prove that the parity check can fail on real CUDA.
"""

from __future__ import annotations

from torch.autograd import Function

from .functions import _flatten_leading

__all__ = ["LinearTailDroppedOnCuda", "TILE"]

TILE = 4


class LinearTailDroppedOnCuda(Function):
    """Bug, on CUDA only: the weight gradient misses the last, partial column tile.

    The classic missing bounds check of a tiled kernel: when ``in_features``
    is not a multiple of :data:`TILE`, the columns of the last tile are never
    written and stay zero. The CPU path is exact, so only a CUDA run, compared
    with CPU or with a reference, can see it.
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input @ weight.T
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_output = grad_output.to(input.dtype)  # 16-bit under autocast, like forward's matmul
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = _flatten_leading(grad_output).T @ _flatten_leading(input)
            tail = weight.shape[1] % TILE
            if grad_output.is_cuda and tail:
                grad_weight = grad_weight.clone()
                grad_weight[:, -tail:] = 0  # BUG: the partial tile is never written
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = _flatten_leading(grad_output).sum(0)
        return grad_input, grad_weight, grad_bias
