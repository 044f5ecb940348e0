"""One more leading dim: a sample's activations as a model hands them to the op.

Kernels are sampled on ``(rows, features)`` and called on ``(batch,
sequence, features)``. Written for two dims, a backward sums the weight's
gradient over dim 0 only, a forward reads the feature count from
``shape[1]`` or the row count from ``shape[0]``: the op then raises in
backward, or is quietly wrong, on every 3-D activation. The variant
splits dim 0 of the first floating tensor argument, and of every tensor
argument whose dim 0 has the same size, into ``(2, n / 2)`` (``(1, n)``
for an odd ``n``): the same values, the same rows, one more dim. Every
other argument is passed as it is.
"""

from dataclasses import dataclass

import torch


@dataclass
class LeadingSplit:
    """A sample with dim 0 of its activations split in two dims."""

    sample: object
    names: list  # the arguments split
    before: tuple  # the first one's shape in the sample ...
    after: tuple  # ... and in the variant

    def describe(self):
        others = f" (and {', '.join(f'`{name}`' for name in self.names[1:])})" if len(self.names) > 1 else ""
        return (f"when `{self.names[0]}`{others} gets one more leading dim: {_shape(self.before)} as "
                f"{_shape(self.after)}")


def leading_split(case, sample):
    """The LeadingSplit of ``sample``, or None when no floating tensor argument has a dim to split."""
    arguments = list(zip(sample.slots(), sample.values()))
    lead = next((value for _, value in arguments if isinstance(value, torch.Tensor) and value.dim() >= 1
                 and (value.is_floating_point() or value.is_complex())), None)
    if lead is None:
        return None
    rows = lead.shape[0]
    split = (2, rows // 2) if rows >= 2 and rows % 2 == 0 else (1, rows)
    names = []

    def change(slot, value):
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
            names.append(case.arg_name(slot))
            return value.detach().reshape(split + tuple(value.shape[1:])).clone()
        return value

    changed = sample.replace(args=[change(slot, value) for slot, value in arguments[:len(sample.args)]],
                             kwargs={slot: change(slot, value) for slot, value in arguments[len(sample.args):]})
    return LeadingSplit(changed, names, tuple(lead.shape), split + tuple(lead.shape[1:]))


def _shape(shape):
    return "(" + ", ".join(str(size) for size in shape) + ")"


HINT = ("the op (or its backward) is written for the sample's number of dims: read sizes from the end "
        "(x.shape[-1], not x.shape[1]), flatten the leading dims before a kernel that expects rows "
        "(x.reshape(-1, x.shape[-1])), and sum a weight's gradient over every leading dim, not only dim 0; if the op "
        "supports only this number of dims by design, make it raise for others (a refused variant is noted, not "
        "failed)")

__all__ = ["HINT", "LeadingSplit", "leading_split"]
