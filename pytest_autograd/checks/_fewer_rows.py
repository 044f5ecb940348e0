"""A large sample cut to its first rows, for the checks whose subject is not the sample's size.

extreme judges what input magnitudes do, growth what each call leaves
alive, noncontiguous what memory layouts do: every row of a batch shows it
alike, and on a sample of millions of elements each row costs them as much
as it costs gradcheck. On a sample whose largest tensor holds over
``ROWS_ELEMENTS`` elements they judge its first rows instead: dim 0 of that
tensor (the batch, the heads, the tokens) is cut until it holds at most
``ROWS_ELEMENTS``, never below ``MIN_ROWS``, and the row itself (the dims a
reduction runs over, where blocks and tails live) is kept whole.
gradcheck, gradgradcheck, reference and precision judge the whole sample,
sizes every other size.

The other tensors follow where their dim 0 has the same size, so the
shapes still fit together: first every tensor of two or more dims (the
activations, a weight whose rows are tied to the batch's), then the 1-D
ones too (a target per row), then the largest tensor alone. An integer
tensor whose values could index the cut dim is taken modulo its new size
(``_size_variants.variant``).

A cut is used only where the op takes the same path on it: its forward and
backward must call the same torch operations, in the same order, as on the
whole sample. A wrapper that hands large inputs to its own kernel and
small ones to a torch fallback (or loops over chunks) calls other
operations on the cut, and is judged on the whole sample, as is an op that
refuses every cut.
"""

import sys
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_autograd.checks._size_variants import Axis, Place, variant
from pytest_autograd.engine.execution import OpRaised, grads_of, prepare, run_op

ROWS_ELEMENTS = 1 << 16  # a sample whose largest tensor holds more is judged on its first rows ...
MIN_ROWS = 2  # ... at least this many


@dataclass(frozen=True)
class FewerRows:
    """Sample ``index`` cut to ``rows`` of its ``of`` rows along dim 0 of ``name`` (and the tensors that follow)."""

    sample: object
    name: str
    rows: int
    of: int

    def describe(self):
        return f"the first {self.rows} of the {self.of} rows (dim 0) of `{self.name}`"


def fewer_rows(context, index, sample):
    """The FewerRows the checks of this run judge sample ``index`` on (made once per sample and device), or None
    when the sample is small enough, its dim 0 too short to cut, or the op refuses every cut."""
    kept = context.case.__dict__.setdefault("_fewer_rows", {})
    key = (index, str(context.device))
    if key not in kept:
        kept[key] = _cut(context, sample)
    return kept[key]


def judged_sample(context, index, sample, check):
    """The sample ``check`` judges at ``index``: its first rows on a large sample (noted), else the sample."""
    found = fewer_rows(context, index, sample)
    if found is None:
        return sample
    context.note(f"{check}: judged on {found.describe()}: what it judges every row shows alike; the whole sample is "
                 "judged by gradcheck, reference and precision")
    return found.sample


def _cut(context, sample):
    tensors = [(slot, value) for slot, value in zip(sample.slots(), sample.values())
               if isinstance(value, torch.Tensor) and value.dim() >= 1]
    if not tensors:
        return None
    slot, largest = max(tensors, key=lambda item: item[1].numel())
    size = largest.shape[0]
    if largest.numel() <= ROWS_ELEMENTS or not size:
        return None
    rows = max(MIN_ROWS, ROWS_ELEMENTS // (largest.numel() // size))
    if 2 * rows > size:
        return None
    whole = _path(context, sample)
    if whole is None:
        return None
    same = [(s, v) for s, v in tensors if v.shape[0] == size]
    tried = []
    for followers in ([(s, v) for s, v in same if v.dim() >= 2], same, [(slot, largest)]):
        places = tuple(s for s, _ in followers)
        if places in tried:
            continue
        tried.append(places)
        axis = Axis(size, [Place(s, context.case.arg_name(s), 0) for s in places])
        cut = variant(context.case, sample, axis, rows, None)
        path = _path(context, cut)
        if path is None:
            continue  # refused: the next cut, or the whole sample
        return FewerRows(cut, context.case.arg_name(slot), rows, size) if path == whole else None
    return None


def _path(context, sample):
    """The torch operations the op's forward and backward call on ``sample``, in order; None when it raises."""
    prepared = prepare(context.case, sample, context.device)
    called = _Called()
    try:
        with torch.enable_grad(), called:
            outputs = run_op(context.case, prepared)
            differentiable = [out for out in outputs if out.requires_grad]
            if differentiable and prepared.leaves:
                grads_of(differentiable, prepared.leaves, [torch.ones_like(out) for out in differentiable])
    except OpRaised:
        return None
    return tuple(called.names)


class _Called(TorchDispatchMode):
    """The name of every operation dispatched while the mode is active."""

    @classmethod
    def _should_skip_dynamo(cls):
        return "torch._dynamo" in sys.modules  # as growth's CreatedTensors: no dynamo import where none compiles

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
