"""A large sample cut to its first rows, for the checks whose subject is not the sample's size.

Most checks judge a behaviour, not a value: what input magnitudes do
(extreme), what memory layouts do (noncontiguous), what a call writes,
keeps alive, aliases, draws or leaves behind (mutation, growth, leak,
aliasing, rng, reentrancy), how it treats inputs that do not require grad
or gradients that are undefined (requires_grad, undefined_grad), what its
raw gradients' metadata is (grad_metadata). Every row of a batch shows it
alike, and on a sample of millions of elements each row costs them as much
as it costs gradcheck. On a sample whose largest tensor holds over
``ROWS_ELEMENTS`` elements they judge its first rows instead: dim 0 of that
tensor (the batch, the heads, the tokens) is cut until it holds at most
``ROWS_ELEMENTS``, never below ``MIN_ROWS``, and the row itself (the dims a
reduction runs over, where blocks and tails live) is kept whole.
gradcheck, gradgradcheck, reference, precision and parity judge the whole
sample, sizes every other size, and determinism the whole sample too (a
kernel may reduce with atomics only once there are enough rows, which no
trace of torch operations shows).

The largest tensor is cut alone first; where the op refuses that, or the
cut does not qualify (below), the other tensors whose dim 0 has the same
size follow it: those of two or more dims (the other activations of
attention), then the 1-D ones too (a target per row). Nothing else changes:
an int argument or an index tensor keeps its values.

A cut is used only where the op treats rows alike and takes the same path
on fewer of them, as far as torch can see:

* the op's forward on the cut gives the first rows of what it gives on the
  whole sample (an output with the rows as its dim 0), and every other
  output unchanged: an op that reduces over dim 0 (a batch norm, a loss, a
  column sum) gives something else on fewer rows, and is judged whole;
* its forward and backward call the same torch operations, in the same
  order, with the same arguments but the sizes: a wrapper that hands large
  inputs to its own kernel and small ones to a torch fallback, or loops
  over chunks, is judged whole;
* the reference runs on the cut and agrees with the op there.

Both runs start from one seed, so an op drawing random numbers row by row
draws the first rows' on the cut. A constant made inside the op
(``torch.tensor``) is traced by value; an index tensor pointing past the
rows the cut keeps refuses it before the op reads out of range (on a GPU, a
device-side assert no later call survives). What no trace of torch
operations shows is not seen: a kernel (Triton, CUDA, a ``torch.library``
op, numpy) that picks another code path by the number of rows inside it,
Python that does something else for large inputs without calling torch.
Such a path is judged by gradcheck, reference and precision on the whole
sample, not by these checks.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.checks._agreement import agree
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.engine.dispatch_mode import DispatchMode
from pytest_autograd.engine.execution import OpRaised, grads_of, prepare, run_op
from pytest_autograd.engine.exploration import Variant, attempt
from pytest_autograd.engine.outcomes import UsageProblem

ROWS_ELEMENTS = 1 << 14  # a sample whose largest tensor holds more is judged on its first rows ...
MIN_ROWS = 2  # ... at least this many
CUT = "the plugin cut the batch there, and an index argument may still point past the rows it kept"


@dataclass(frozen=True)
class FewerRows:
    """Sample ``index`` cut to ``rows`` of its ``of`` rows along dim 0 of ``name`` (and the tensors that follow)."""

    sample: object
    name: str
    rows: int
    of: int
    flat: bool = False  # the tensor cut has one dim: its rows are elements

    def describe(self):
        if self.flat:
            return f"the first {self.rows} of the {self.of} elements of `{self.name}`"
        return f"the first {self.rows} of the {self.of} rows (dim 0) of `{self.name}`"

    def detail(self):
        """The line a failure found on these rows carries."""
        return (f"judged on {self.describe()}, each row whole: what this check judges shows on every row alike "
                "(gradcheck, reference and precision judge every row)")


def fewer_rows(context, index, sample):
    """The FewerRows the checks of this run judge sample ``index`` on (made once per sample and device), or None
    when the sample is small enough, its dim 0 too short to cut, or the op refuses every cut."""
    kept = context.case.__dict__.setdefault("_fewer_rows", {})
    key = (index, str(context.device))
    if key not in kept:
        kept[key] = _cut(context, sample)
        if kept[key] is not None:
            context.case.__dict__.setdefault("_cut_from", {})[id(kept[key].sample)] = sample
    return kept[key]


def whole_of(case, sample):
    """The sample ``sample`` is the first rows of (itself when it is no such cut): what a float64 plan, known or
    adopted, is about."""
    return case.__dict__.get("_cut_from", {}).get(id(sample), sample)


def judged_sample(context, index, sample):
    """What the check of ``context`` judges at sample ``index``: its first rows on a large sample (recorded, so
    that a failure names them), else the sample itself."""
    found = fewer_rows(context, index, sample)
    if found is None:
        return sample
    context.rows_judged[index] = found
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
    whole = _traced(context, sample, size, rows)
    if whole is None or not any(out.dim() and out.shape[0] == size for out in whole.outputs):
        return None  # no output has the rows: the op reduces over them
    same = [(s, v) for s, v in tensors if v.shape[0] == size]
    tried = []
    for followers in ([slot], [s for s, v in same if v.dim() >= 2], [s for s, _ in same]):
        if followers in tried:
            continue
        tried.append(followers)
        cut = sample.map(lambda s, v: v.narrow(0, 0, rows).clone() if s in followers else v)  # noqa: B023
        variant = Variant(context.check_name, f"on the first {rows} of the {size} rows of "
                                              f"`{context.case.arg_name(slot)}`", missing=CUT,
                          how="the whole sample is judged instead")
        found = attempt(context, variant, lambda: _traced(context, cut, size, rows), otherwise=None)  # noqa: B023
        if found is not None and found.calls == whole.calls and \
                _first_rows(context, whole.outputs, found.outputs, size, rows) and \
                _reference_agrees(context, cut, found.outputs):
            return FewerRows(cut, context.case.arg_name(slot), rows, size, largest.dim() == 1)
    return None


@dataclass
class _Traced:
    calls: tuple  # (operation, its arguments with tensors and the sizes left out), in order
    outputs: list  # the forward's outputs, detached


def _traced(context, sample, size, rows):
    """The op's forward and backward on ``sample`` in its own dtypes, from the run's seed, with every torch
    operation called recorded; None when it raises or returns no tensor."""
    prepared = prepare(context.case, sample, context.device)
    called = _Called({size, rows})
    seed_generators(context.device, context.seed)
    try:
        with torch.enable_grad(), called:
            outputs = run_op(context.case, prepared)
            differentiable = [out for out in outputs if out.requires_grad]
            if differentiable and prepared.leaves:
                grads_of(differentiable, prepared.leaves, [torch.ones_like(out) for out in differentiable])
    except (OpRaised, UsageProblem):
        return None
    return _Traced(tuple(called.calls), [out.detach() for out in outputs])


def _first_rows(context, whole, cut, size, rows):
    """Whether the outputs on the cut are those on the whole sample, an output with the rows cut to its first
    rows."""
    if len(whole) != len(cut):
        return False
    for expected, got in zip(whole, cut):
        if expected.dim() and expected.shape[0] == size:
            expected = expected.narrow(0, 0, rows)
        if not _alike(context, expected, got):
            return False
    return True


def _reference_agrees(context, cut, outputs):
    """Whether ``reference=`` (if any) runs on the cut and gives the op's outputs there."""
    reference = context.case.reference
    if reference is None:
        return True
    seed_generators(context.device, context.seed)
    try:
        with torch.no_grad():
            expected = run_op(context.case, prepare(context.case, cut, context.device), fn=reference)
    except (OpRaised, UsageProblem):
        return False
    return len(expected) == len(outputs) and all(_alike(context, e, g) for e, g in zip(expected, outputs))


def _alike(context, expected, got):
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return False
    if not expected.is_floating_point():
        return bool(torch.equal(expected, got))
    return agree(expected, got, *context.tolerance(expected.dtype))


class _Called(DispatchMode):
    """Every torch operation dispatched while the mode is active, with its arguments: tensors, and ints equal
    to the sliced dim's size on either side, left out."""

    def __init__(self, sizes):
        super().__init__()
        self.sizes, self.calls = sizes, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name.startswith(_LIFTED):  # torch.tensor(...) inside the op: a constant, whose value is the call's
            self.calls.append((name, self._plain(_values(args[0]))))
        else:
            self.calls.append((name, self._plain(args), self._plain(sorted(kwargs.items()))))
            _check_bounds(name, args, kwargs)
        return func(*args, **kwargs)

    def _plain(self, value):
        if isinstance(value, (list, tuple)):
            return tuple(self._plain(item) for item in value)
        if isinstance(value, torch.Tensor):
            return "tensor"
        if isinstance(value, int) and not isinstance(value, bool) and value in self.sizes:
            return "rows"
        if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
                              torch.memory_format)):
            return value
        return type(value).__name__


_LIFTED = ("aten.lift_fresh", "aten.lift")
CONSTANT_VALUES = 64  # a constant made inside the op with this many elements or fewer is traced by value


def _values(tensor):
    if tensor.numel() <= CONSTANT_VALUES:
        return tuple(tensor.detach().cpu().reshape(-1).tolist())
    return (tuple(tensor.shape), float(tensor.detach().double().sum()))


# Operations that index a dim of a tensor with an index tensor: (position of the indexed tensor, of the dim or
# the dim itself as ("dim", d), of the index). The first rows of a large tensor indexed by the sample's own
# indices go out of range, which on a GPU is a device-side assert no later call survives: checked here first.
_INDEXING = {
    "aten.index_select": (0, 1, 2), "aten.index_add": (0, 1, 2), "aten.index_copy": (0, 1, 2),
    "aten.index_fill": (0, 1, 2), "aten.index_reduce": (0, 1, 2), "aten.gather": (0, 1, 2),
    "aten.scatter": (0, 1, 2), "aten.scatter_add": (0, 1, 2), "aten.scatter_reduce": (0, 1, 2),
    "aten.embedding": (0, ("dim", 0), 1), "aten._embedding_bag": (0, ("dim", 0), 1),
    "aten.take": (0, None, 1),
}


def _check_bounds(name, args, kwargs):
    """Raise IndexError when an indexing operation's index tensor holds a value outside the dim it indexes."""
    base = ".".join(name.split(".")[:2]).rstrip("_")  # aten.index_add_.default: aten.index_add
    if base in ("aten.index", "aten.index_put", "aten._index_put_impl"):
        tensor, indices = args[0], args[1]
        for dim, index in enumerate(indices):
            if index is not None and index.dtype != torch.bool:
                _in_range(index, tensor.shape[dim], name)
        return
    layout = _INDEXING.get(base)
    if layout is None or len(args) <= layout[2]:
        return
    tensor, where, index = args[layout[0]], layout[1], args[layout[2]]
    if not isinstance(index, torch.Tensor) or index.dtype == torch.bool or not index.numel():
        return
    if where is None:
        _in_range(index, tensor.numel(), name)
    else:
        dim = where[1] if isinstance(where, tuple) else args[where]
        _in_range(index, tensor.shape[dim] if tensor.dim() else 1, name)


def _in_range(index, size, name):
    low, high = (int(v) for v in torch.aminmax(index.detach().reshape(-1)))
    if low < -size or high >= size:
        raise IndexError(f"{name}: index {high if high >= size else low} out of range for a dim of {size}")
