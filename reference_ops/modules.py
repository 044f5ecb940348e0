"""``nn.Module`` ops: a module wrapping a custom Function, correct and with a planted bug.

* :class:`FunctionLinear` -- ``nn.Linear``'s parameters and initialisation,
  forward through :class:`reference_ops.LinearFunction`; passes every default
  check with ``op=FunctionLinear(3, 2)``.
* :class:`FunctionLinearWeightGradTransposed` -- the same module on
  :class:`reference_ops.buggy.LinearWeightGradTransposed`: the input gradient
  is right, only the gradient of the ``weight`` *parameter* is wrong, so the
  bug is found only when parameters are differentiated like inputs.
"""

import math

import torch
from torch import nn

from .buggy import LinearWeightGradTransposed
from .functions import LinearFunction

__all__ = ["FunctionLinear", "FunctionLinearWeightGradTransposed"]


class FunctionLinear(nn.Module):
    """``nn.Linear`` whose forward calls :class:`LinearFunction`."""

    function = LinearFunction

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))

    def forward(self, input):
        return self.function.apply(input, self.weight, self.bias)


class FunctionLinearWeightGradTransposed(FunctionLinear):
    """Bug: the wrapped Function returns the weight gradient transposed (reshaped to fit)."""

    function = LinearWeightGradTransposed
