"""Deciding in a few passes that two tensors agree, before the full comparison that finds the worst element.

``compare_tensors`` handles NaN, infinities and complex values and locates
the worst element: about twenty passes over the data, the largest cost of
several checks on a million-element sample. Almost every comparison agrees,
and for finite real tensors agreement is one inequality per element:
``|expected - got| <= atol * max(1, max|expected|) + rtol * |expected|``,
exactly the test ``compare_tensors`` applies. :func:`agree` evaluates it in
float64 and answers True only when it holds everywhere with nothing special
in ``expected``; anything else goes to ``compare_tensors``, which gives the
verdict and the report. Bitwise-equal tensors (two runs of one kernel)
agree after one pass that allocates nothing.
"""

import math

import torch


def agree(expected, got, atol, rtol):
    """True when ``compare_tensors(expected, got, atol, rtol)`` would find no mismatch (decided cheaply);
    False when it must be asked."""
    if tuple(expected.shape) != tuple(got.shape) or not (expected.is_floating_point() and got.is_floating_point()):
        return False
    if expected.dtype == got.dtype and expected.device == got.device and bool(torch.equal(expected, got)):
        return True  # bitwise equal (two runs of one kernel, mostly): no element can differ; NaN is never equal
    expected = expected.detach().to(torch.float64)
    got = got.detach().to(device=expected.device, dtype=torch.float64)
    if expected.numel() == 0:
        return True
    allowed = expected.abs()
    peak = float(allowed.max())
    if not math.isfinite(peak):  # NaN or an infinity: the special cases are compare_tensors' to judge
        return False
    allowed.mul_(rtol).add_(atol * max(1.0, peak))
    return bool(((expected - got).abs_() <= allowed).all())  # a NaN in got compares False: asked again
