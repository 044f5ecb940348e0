"""A long-reduction variant of a sample: its rows repeated until sums over them are long.

A gradient summed over rows (a norm's weight and bias, a linear's weight,
any parameter shared across a batch) adds as many terms as the input has
rows. An accumulator kept in 16 bits (a partial-sum buffer allocated in the
activations' dtype, a running sum in bfloat16) loses precision with the
number of terms, so a test sample of a few rows never shows it, while
training on thousands of rows does. The variant repeats the sample's rows
(along the leading dimension) until there are ``LONG_ROWS`` of them: the
same values, so the op's domain is respected, and a random cotangent keeps
the sums random.

Which arguments have rows: first the tensors shaped exactly like the first
floating argument (inputs, residuals, targets of the same shape); if the op
refuses that, every tensor whose leading dimension is that argument's
(per-row labels, masks). An op that takes neither keeps its sample only.
"""

import math
from dataclasses import dataclass

import torch

LONG_ROWS = 8192  # rows in the variant: the length of the reductions over them
MAX_ELEMENTS = 1 << 22  # no variant larger than this, in elements of its largest argument


@dataclass
class Variant:
    sample: object
    description: str


def long_reduction_variants(case, sample):
    """Candidate variants of ``sample``, to be tried in order until the op runs one; [] when it has no rows."""
    values = sample.values()
    first = next((v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
    if first is None or first.dim() < 2 or first.shape[-1] == 0:
        return []
    rows = first.numel() // first.shape[-1]
    if rows == 0 or rows >= LONG_ROWS:
        return []
    times = min(math.ceil(LONG_ROWS / rows), MAX_ELEMENTS // max(first.numel(), 1))
    if times < 2:
        return []
    lead = first.shape[0]
    same_shape = _repeated(case, sample, times, lambda v: v.shape == first.shape)
    same_lead = _repeated(case, sample, times, lambda v: v.dim() >= 1 and v.shape[0] == lead)
    variants = [same_shape]
    if same_lead is not None and same_lead.description != same_shape.description:
        variants.append(same_lead)
    return variants


def _repeated(case, sample, times, chosen):
    """``sample`` with the tensors ``chosen`` selects repeated ``times`` along dim 0."""
    names = []

    def repeat(slot, value):
        if not (isinstance(value, torch.Tensor) and value.dim() >= 1 and chosen(value)):
            return value
        names.append(f"`{case.arg_name(slot)}` to {value.shape[0] * times} x {list(value.shape[1:])}")
        return value.detach().repeat(times, *([1] * (value.dim() - 1)))

    args = [repeat(i, a) for i, a in enumerate(sample.args)]
    kwargs = {k: repeat(k, v) for k, v in sample.kwargs.items()}
    if not names:
        return None
    return Variant(sample.replace(args=args, kwargs=kwargs),
                   f"the sample's rows repeated {times} times along dim 0 ({', '.join(names)})")
