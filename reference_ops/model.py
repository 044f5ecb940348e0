"""A small transformer built from the shipped custom ops, for the model scan (``autograd_model``).

Each block is ``x + attention(norm(x))`` then ``x + mlp(norm(x))``, the way
decoder blocks are written, with every heavy piece a custom op:

* norms: :class:`reference_ops.triton_ops.TritonRMSNorm` (Triton kernels;
  on CPU they need ``TRITON_INTERPRET=1`` before triton is imported);
* the query/key/value and MLP projections: :class:`reference_ops.functions.LinearFunction`;
* the attention output projection: the C++ extension's operator
  ``torch.ops.autograd_ext.linear_forward`` where the extension builds
  (``extension=None`` decides by trying; ``False`` uses ``LinearFunction``);
* the MLP gate: :class:`~reference_ops.functions.MyReLU` and
  :class:`~reference_ops.functions.ElementwiseMul`;
* a fixed positional scale table multiplied in with ``ElementwiseMul``: a
  buffer, so the scan checks it as a constant;
* the final norm's weight is frozen (``requires_grad=False``).

``planted_bug=True`` makes the MLP's down projection
:class:`reference_ops.buggy.LinearWeightGradTransposed` (its weight
gradient is the transpose of the right one), which a scan must find and
name with its call site.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .functions import ElementwiseMul, LinearFunction, MulConstant, MyReLU

__all__ = ["TinyTransformer", "Block", "uses_extension", "model_inputs"]


def _parameter(*shape, scale=None):
    scale = 1.0 / math.sqrt(shape[-1]) if scale is None else scale
    return nn.Parameter(torch.randn(*shape) * scale)


def uses_extension(extension=None):
    """Whether the model's attention output projection runs the C++ extension's operator."""
    if extension is False:
        return False
    from .extension import extension_available

    available = extension_available()
    if extension and not available:
        from .extension import load_extension

        load_extension()  # raises, naming what is missing
    return available


class RMSNorm(nn.Module):
    def __init__(self, hidden, frozen=False):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden) + 0.5, requires_grad=not frozen)

    def forward(self, x):
        from .triton_ops import TritonRMSNorm

        return TritonRMSNorm.apply(x, self.weight, 1e-6)


class Attention(nn.Module):
    def __init__(self, hidden, heads, extension):
        super().__init__()
        self.heads = heads
        self.qkv_weight = _parameter(3 * hidden, hidden)
        self.qkv_bias = nn.Parameter(torch.zeros(3 * hidden))
        self.out_weight = _parameter(hidden, hidden)
        self.out_bias = nn.Parameter(torch.zeros(hidden))
        self.extension = extension

    def forward(self, x):
        batch, length, hidden = x.shape
        q, k, v = LinearFunction.apply(x, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = MulConstant.apply(q @ k.transpose(-2, -1), 1.0 / math.sqrt(q.shape[-1]))
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, length, hidden)
        if self.extension:
            return torch.ops.autograd_ext.linear_forward(mixed, self.out_weight, self.out_bias)
        return LinearFunction.apply(mixed, self.out_weight, self.out_bias)


class MLP(nn.Module):
    def __init__(self, hidden, inner, planted_bug):
        super().__init__()
        self.gate_weight = _parameter(inner, hidden)
        self.up_weight = _parameter(inner, hidden)
        self.down_weight = _parameter(hidden, inner)
        self.down_bias = nn.Parameter(torch.zeros(hidden))
        self.planted_bug = planted_bug

    def forward(self, x):
        gated = ElementwiseMul.apply(MyReLU.apply(LinearFunction.apply(x, self.gate_weight)),
                                     LinearFunction.apply(x, self.up_weight))
        if self.planted_bug:
            from .buggy import LinearWeightGradTransposed

            return LinearWeightGradTransposed.apply(gated, self.down_weight, self.down_bias)
        return LinearFunction.apply(gated, self.down_weight, self.down_bias)


class Block(nn.Module):
    def __init__(self, hidden, heads, inner, extension, planted_bug):
        super().__init__()
        self.attention_norm = RMSNorm(hidden)
        self.attention = Attention(hidden, heads, extension)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = MLP(hidden, inner, planted_bug)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(nn.Module):
    """``layers`` blocks of width ``hidden`` on inputs of shape ``(batch, length, hidden)``."""

    def __init__(self, hidden=12, heads=2, inner=20, layers=2, max_length=16, extension=None, planted_bug=False):
        super().__init__()
        extension = uses_extension(extension)
        positions = torch.arange(max_length, dtype=torch.float32)[:, None]
        self.register_buffer("position_scale", 1.0 + 0.1 * torch.cos(positions / (1.0 + torch.arange(hidden))))
        self.blocks = nn.ModuleList(Block(hidden, heads, inner, extension, planted_bug and index == layers - 1)
                                    for index in range(layers))
        self.norm = RMSNorm(hidden, frozen=True)

    def forward(self, x):
        x = ElementwiseMul.apply(x, self.position_scale[: x.shape[1]].expand_as(x))
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def model_inputs(batch=2, length=5, hidden=12, dtype=torch.float32, device="cpu"):
    """One call's inputs, ``(x,)``: 2 x 5 = 10 rows, which the Triton norm's 4-row tiles do not divide."""
    return (torch.randn(batch, length, hidden, dtype=dtype, device=device),)
