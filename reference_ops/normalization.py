"""Batch normalisation in training mode, as kernel authors wrap it: a correct op for the checks.

With equal values along the batch (the layout check's stride-0 expansion
makes them), the variance is 0 and the op amplifies rounding by
1/sqrt(eps): a point where layouts differ in float32 and agree in float64.
It updates its running statistics in place, declared with ``mutates=``.
"""

import torch
import torch.nn.functional as F


def batch_norm_train(input, running_mean, running_var, weight, bias):
    """``F.batch_norm`` in training mode, momentum 0.1, eps 1e-5."""
    return F.batch_norm(input, running_mean, running_var, weight, bias, training=True, momentum=0.1, eps=1e-5)


def batch_norm_samples(dtype=torch.float32):
    channels = 3
    return [(torch.randn(6, channels, dtype=dtype), torch.zeros(channels, dtype=dtype),
             torch.ones(channels, dtype=dtype), torch.rand(channels, dtype=dtype) + 0.5,
             torch.randn(channels, dtype=dtype))]


MARKER_OPTIONS = {"constants": ("running_mean", "running_var"), "mutates": ("running_mean", "running_var")}
