"""Random values for cotangents, probe directions and jitter, drawn fast on large tensors.

``torch.randn`` in float64 on CPU costs about 50 ms per million elements
(100 ns an element at 16k), more than most ops' forward; in float32 it costs
a sixth of that or less. The checks only need values that are random,
sign-mixed and not special, not float64's resolution, so a tensor of
``LARGE_DRAW`` elements or more is drawn in float32 and widened. Smaller ones
are drawn in float64 as before, so every small sample sees the same values
it always did.

Checks that compare an op with itself or watch what a call leaves behind
(layouts, reruns, leaks, mutation) need cotangents that are sign-mixed and
differ from element to element, not independent ones: past ``REPEAT_AFTER``
elements theirs repeat one random block (``repeating_normal_like``), a copy
instead of a draw, about 20 times cheaper. The block's length is a prime,
so no row, tile or stride of a real shape lines up with its repeats. The
checks that compare gradients with another computation's (the derivative
checks, reference, parity, extreme) draw every element.
"""

import math

import torch

LARGE_DRAW = 1 << 12  # elements from which values are drawn in float32
REPEAT_AFTER = 65537  # a prime: repeating draws repeat a block of this many values


def normal(shape, generator):
    """Standard normal values in float64 (drawn in float32 when large)."""
    if math.prod(shape) < LARGE_DRAW:
        return torch.randn(shape, generator=generator, dtype=torch.float64)
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(torch.float64)


def uniform(shape, generator):
    """Uniform values in [0, 1) in float64 (drawn in float32 when large)."""
    if math.prod(shape) < LARGE_DRAW:
        return torch.rand(shape, generator=generator, dtype=torch.float64)
    return torch.rand(shape, generator=generator, dtype=torch.float32).to(torch.float64)


def normal_like(shape, generator, device, dtype):
    """Standard normal values in ``dtype`` on ``device``: one conversion, none when drawn in that dtype."""
    if math.prod(shape) >= LARGE_DRAW and dtype == torch.float32:
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
    return normal(shape, generator).to(device=device, dtype=dtype)


def repeating_normal_like(shape, generator, device, dtype):
    """Standard normal values in ``dtype`` on ``device`` that repeat every ``REPEAT_AFTER`` elements (drawn
    independently below that): cotangents for checks that need varied values, not independent ones."""
    n = math.prod(shape)
    if n <= REPEAT_AFTER:
        return normal_like(shape, generator, device, dtype)
    block = torch.randn((REPEAT_AFTER,), generator=generator, dtype=torch.float32)
    return block.repeat(-(-n // REPEAT_AFTER))[:n].view(shape).to(device=device, dtype=dtype)


def probe_direction(n, generator, device):
    """A probe's direction over ``n`` elements: random signs and magnitudes in [1, 2] (``u + sign(u)`` for ``u``
    uniform in (-1, 1)), in float64 on ``device``; a large one is shaped in float32 before it is widened."""
    if n < LARGE_DRAW:
        u = torch.rand((n,), generator=generator, dtype=torch.float64).mul_(2).sub_(1)
        return u.add_(u.sign()).to(device)
    u = torch.rand((n,), generator=generator, dtype=torch.float32).mul_(2).sub_(1)
    return u.add_(u.sign()).to(device=device, dtype=torch.float64)
