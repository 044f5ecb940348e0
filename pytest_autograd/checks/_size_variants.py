"""Size variants of a sample: its distinct dimension sizes, where each occurs, and the sizes it is tried at.

A size is changed consistently: every dim of every tensor argument that has
it, and every int argument equal to it (``n_cols=256``, ``normalized_shape=(256,)``),
so shape constraints between arguments (``x: (B, S, H)``, ``w: (H, H)``) hold
in every variant. Values are the sample's own: a smaller size keeps the
leading slice, a larger one repeats the sample along the dim and moves every
floating value but those of one copy (the last whole one, so the sample's
largest values lie past the first block) a random fraction of the way
towards the middle of its tensor's range, so values stay inside the range
the user chose (a positive input stays positive, no ties are created for
sort or max) while no two elements are equal. ``constants=`` and integer
tensors are repeated as they are; an integer tensor whose values could
index a shrunk dim is taken modulo the new size, and a size that an integer
tensor holds as its largest value (lengths, offsets such as ``cu_seqlens``)
is kept fixed.

On a large sample (its largest tensor over ``CUT_ELEMENTS``), each size's
variants are taken with the *other* sizes cut (halved, never below
``CUT_FLOOR``) until the sample without the change fits: ``x`` of
``(4096, 1024)`` is tried at 4097 rows of 16 columns and at 1025 columns of
16 rows. A tail, a missing program, a split boundary or a squeezed dim shows
at any number of rows, so each variant costs a few thousand elements, not a
few million; the sample's own sizes are the other checks' to judge. A size
already spanning several blocks (``LARGE_FLOOR`` or more) gets no
several-blocks variant.
"""

import math
from dataclasses import dataclass, field

import torch

from pytest_autograd.engine.draws import uniform
from pytest_autograd.engine.outcomes import UsageProblem

PLUS_ONE, MINUS_ONE, ONE, ODD, SMALL, LARGE, DECLARED = (
    "size + 1", "size - 1", "1", "odd, just past a power of two", "small, another path", "several blocks",
    "sizes= on the marker")
PRIORITY = (PLUS_ONE, MINUS_ONE, ONE, ODD, SMALL, LARGE, DECLARED)  # judged in this order, most telling first
# Kernels often take another path for rows that fit half a warp, a warp or two: a size above such a width is also
# tried at an odd size under it (a multiple of no vector width, past the half of the one before)
SMALL_PATHS = ((11, 16), (19, 32), (45, 64))  # (size tried, the width whose path it takes)
LARGE_FLOOR = 2048  # the several-blocks size is at least this (+3): it spans blocks of up to 1024 elements
LARGE_ELEMENTS = 1 << 18  # ... unless a tensor would then exceed this many elements (or 4x the sample's largest; the
# other sizes of a variant, twice it)
CUT_ELEMENTS = 1 << 14  # a sample larger than this has its other sizes cut for each size's variants ...
CUT_FLOOR = 16  # ... each halved while it stays at least this
JITTER = (0.05, 0.3)  # repeated floating values move this fraction of the way towards their range's middle

EXAMPLE = "sizes={64: None, 256: [255, 300, 1000]}"


@dataclass
class Place:
    """Where a size occurs: a dim of a tensor argument, or an int argument (``dim`` None) equal to it."""

    slot: object  # int (positional) or str (keyword)
    name: str
    dim: int = None
    path: tuple = ()  # the position inside a list/tuple argument

    def describe(self):
        if self.dim is None:
            inside = "".join(f"[{i}]" for i in self.path)
            return f"`{self.name}{inside}` (an int argument equal to the size)"
        return f"dim {self.dim} of `{self.name}`"


@dataclass
class Axis:
    """One distinct size of one sample: where it occurs and the sizes it is tried at (none when ``fixed``)."""

    size: int
    places: list
    sizes: list = field(default_factory=list)  # (new size, kind) pairs
    fixed: str = None  # why the size is kept, or None
    cuts: list = field(default_factory=list)  # (other Axis, smaller size): where its variants are taken

    @property
    def tensor_places(self):
        return [p for p in self.places if p.dim is not None]

    def where(self, argument=None):
        """``dim 2 of `x``` for the argument the report is about when it has the size, else the first tensor's."""
        tensor_places = self.tensor_places
        place = next((p for p in tensor_places if p.name == argument), tensor_places[0])
        return place

    def together(self):
        return ", ".join(p.describe() for p in self.places)


def requested_sizes(case):
    """``sizes=`` from the marker as {size: list of sizes, or None to keep it fixed}; validated."""
    requested = case.option("sizes")
    if requested is None:
        return {}
    if not isinstance(requested, dict):
        raise UsageProblem(f"sizes= must be a dict from a dimension size in your samples to the sizes to try "
                           f"instead (a list of ints), or to None to keep that size fixed, e.g. {EXAMPLE}; "
                           f"got {requested!r}.")
    parsed = {}
    for key, value in requested.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise UsageProblem(f"sizes= keys are dimension sizes of your samples (ints >= 0), got {key!r}; "
                               f"e.g. {EXAMPLE}.")
        if value is None or value is False:
            parsed[key] = None
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple, range, set, frozenset)):
            raise UsageProblem(f"sizes={{{key}: {value!r}}}: give a list of sizes to try instead of {key}, or "
                               f"None to keep {key} fixed; e.g. {EXAMPLE}.")
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        if bad:
            raise UsageProblem(f"sizes={{{key}: ...}} holds {bad[0]!r}; sizes are ints >= 0, e.g. {EXAMPLE}.")
        parsed[key] = sorted(set(value) - {key}) or None
    return parsed


def check_requested_sizes_occur(case, requested):
    """A ``sizes=`` key that no sample has is a mistake (a typo, or a size that changed): say which sizes exist."""
    present = set()
    for sample in case.samples:
        for _, _, value in _tensor_arguments(sample):
            if value.is_floating_point() or value.is_complex():
                present.update(value.shape)
    missing = sorted(set(requested) - present)
    if missing:
        raise UsageProblem(f"sizes= names size {', '.join(map(str, missing))}, which no floating tensor argument of "
                           f"any sample has; the sizes in your samples are: {', '.join(map(str, sorted(present)))}.")


def axes_of(case, sample, requested):
    """The Axis of each distinct size (>= 2, or named in ``sizes=``) of the sample's floating tensors."""
    tensors = _tensor_arguments(sample)
    sizes = set()
    for _, _, value in tensors:
        if value.is_floating_point() or value.is_complex():
            sizes.update(s for s in value.shape if s >= 2 or s in requested)
    axes = []
    for size in sorted(sizes):
        places = [Place(slot, case.arg_name(slot), dim) for slot, _, value in tensors
                  for dim, s in enumerate(value.shape) if s == size]
        places += _int_places(case, sample, size)
        axis = Axis(size, places)
        if size in requested:  # the marker's word wins over any guess
            if requested[size] is None:
                axis.fixed = "sizes= on the marker keeps it"
            else:
                axis.sizes = [(s, DECLARED) for s in requested[size]]
        else:
            axis.fixed = _held_as_value(case, tensors, size)
        axes.append(axis)
    for axis in axes:
        if axis.fixed is None and not axis.sizes:
            axis.cuts = cuts_for(tensors, axes, axis)
            largest = variant_numel(tensors, axis, axis.size, axis.cuts)
            axis.sizes = derived_sizes(axis.size, lambda m, axis=axis: variant_numel(tensors, axis, m, axis.cuts),
                                       largest)
    return axes


def cuts_for(tensors, axes, axis, limit=CUT_ELEMENTS):
    """(other Axis, smaller size) pairs that bring a large sample under ``limit`` elements while ``axis`` keeps its
    size: the largest other size halved, again and again, never below CUT_FLOOR; none for a sample that fits."""
    others = [other for other in axes if other is not axis and other.fixed is None and other.size >= 2 * CUT_FLOOR]
    cut = {id(other): other.size for other in others}

    def numel():
        return variant_numel(tensors, axis, axis.size, [(other, cut[id(other)]) for other in others])

    while numel() > limit:
        halvable = [other for other in others if cut[id(other)] // 2 >= CUT_FLOOR]
        if not halvable:
            break
        biggest = max(halvable, key=lambda other: cut[id(other)])
        cut[id(biggest)] //= 2
    return [(other, cut[id(other)]) for other in others if cut[id(other)] != other.size]


def derived_sizes(n, numel_at, largest):
    """(size, kind) pairs for a sample size ``n``: the tails and edges kernels get wrong."""
    found = {}
    small = [(size, SMALL) for size, width in SMALL_PATHS if n > width]
    for size, kind in ((n + 1, PLUS_ONE), (n - 1, MINUS_ONE), (1, ONE), (odd_past_power_of_two(n), ODD), *small):
        if size >= 1 and size != n and size not in found and numel_at(size) <= max(LARGE_ELEMENTS, 2 * largest):
            found[size] = kind
    large = several_blocks(n, numel_at, max(LARGE_ELEMENTS, 4 * largest)) if n < LARGE_FLOOR else None
    if large is not None and large > max(found, default=n):
        found[large] = LARGE
    return list(found.items())


def odd_past_power_of_two(n):
    """2**k + 1, the first such size above n + 1: one element past a power-of-two block (33, 257, 513)."""
    power = 1
    while power + 1 <= n + 1:
        power *= 2
    return power + 1


def several_blocks(n, numel_at, cap):
    """A size spanning several blocks of up to 1024 (max(4n, 2048) + 3), smaller if tensors would exceed ``cap``."""
    size = max(4 * n, LARGE_FLOOR) + 3
    if numel_at(size) <= cap:
        return size
    low, high = n + 1, size  # numel grows with the size: the largest that fits
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if numel_at(middle) <= cap else (low, middle)
    size = (low - 3) // 8 * 8 + 3  # 3 past a multiple of 8: a partial block for any power-of-two block
    return size if size > 2 * n + 1 else None


def variant_numel(tensors, axis, size, cuts=()):
    """The largest tensor's element count when ``axis`` takes ``size`` (and the ``cuts`` axes their sizes)."""
    largest = 0
    for slot, _, value in tensors:
        shape = _shape_at(slot, value.shape, [(axis, size)] + list(cuts))
        largest = max(largest, math.prod(shape))
    return largest


def _shape_at(slot, shape, changes):
    """``shape`` of the tensor in ``slot`` with each (Axis, size) of ``changes`` applied to its dims."""
    shape = list(shape)
    for axis, size in changes:
        for place in axis.tensor_places:
            if place.slot == slot:
                shape[place.dim] = size
    return shape


def growth(sample, axis, size):
    """How many times the sample's elements (all tensors together) the variant with ``axis`` at ``size`` has
    (with the axis' cuts)."""
    tensors = _tensor_arguments(sample)
    before = sum(value.numel() for _, _, value in tensors)
    after = sum(math.prod(_shape_at(slot, value.shape, [(axis, size)] + list(axis.cuts)))
                for slot, _, value in tensors)
    return after / before if before else 1.0


def cut_base(case, sample, axis):
    """``sample`` with ``axis``' cuts applied (the sample itself without cuts): where its variants are taken."""
    for other, size in axis.cuts:
        sample = variant(case, sample, other, size, None)
    return sample


def cut_all(case, sample, axes, limit):
    """``sample`` with every size it has cut as a variant's others are, until it has ``limit`` elements or fewer
    (never below CUT_FLOOR), and the cuts: where a change that is not a size (one more leading dim) is tried
    cheaply."""
    cuts = cuts_for(_tensor_arguments(sample), axes, Axis(0, []), limit)
    for other, size in cuts:
        sample = variant(case, sample, other, size, None)
    return sample, cuts


def describe_cuts(axis):
    """``dim 1 of `x` cut from 1024 to 16, ...`` for a report."""
    return describe_cut_list(axis.cuts)


def describe_cut_list(cuts):
    return ", ".join(f"{other.tensor_places[0].describe()} cut from {other.size} to {size}" for other, size in cuts)


def variant(case, sample, axis, size, generator):
    """``sample`` with ``axis`` at ``size``: tensors resized along its dims, int arguments equal to it replaced."""
    dims_of = {}
    for place in axis.tensor_places:
        dims_of.setdefault(place.slot, []).append(place.dim)
    ints = [p for p in axis.places if p.dim is None]

    def change(slot, value):
        if isinstance(value, torch.Tensor):
            dims = dims_of.get(slot)
            if dims:
                jitter = (value.is_floating_point() or value.is_complex()) and slot not in case.constant_slots
                value = _resized(value.detach(), dims, axis.size, size, jitter, generator)
            if _could_index(value, axis.size) and size < axis.size:
                value = value.remainder(max(size, 1))
            return value
        for place in ints:
            if place.slot == slot:
                value = _replaced(value, place.path, size)
        return value

    return sample.map(change)


def _tensor_arguments(sample):
    return [(slot, value.shape, value) for slot, value in list(enumerate(sample.args)) + list(sample.kwargs.items())
            if isinstance(value, torch.Tensor)]


def _int_places(case, sample, size):
    """Int arguments (top level, or inside a list/tuple argument) equal to ``size``: they follow it."""
    places = []
    for slot, value in list(enumerate(sample.args)) + list(sample.kwargs.items()):
        if _is_int(value) and value == size:
            places.append(Place(slot, case.arg_name(slot)))
        elif isinstance(value, (list, tuple)):
            places += [Place(slot, case.arg_name(slot), None, (i,)) for i, item in enumerate(value)
                       if _is_int(item) and item == size]
    return places


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _replaced(value, path, size):
    if not path:
        return size
    items = list(value)
    items[path[0]] = size
    return type(value)(items)


def _is_index_like(value):
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() \
        and value.dtype != torch.bool and value.numel() > 0


def _held_as_value(case, tensors, size):
    """Why ``size`` is kept when an integer tensor holds it as its largest value (lengths, offsets), else None."""
    for slot, _, value in tensors:
        if _is_index_like(value) and int(value.max()) == size:
            return (f"`{case.arg_name(slot)}` holds it as its largest value (a length or an offset tied to the size?); "
                    f"sizes={{{size}: [...]}} on the marker names sizes to try anyway")
    return None


def _could_index(value, size):
    """An integer tensor whose values could index a dim of ``size``: all in [0, size)."""
    return _is_index_like(value) and int(value.min()) >= 0 and int(value.max()) < size


def _resized(tensor, dims, old, new, jitter, generator):
    """``tensor`` with each dim in ``dims`` (of size ``old``) made ``new``: cut, or repeated and jittered."""
    grown_dims = []
    for dim in dims:
        if new <= old:
            tensor = tensor.narrow(dim, 0, new)
            continue
        repeats = [1] * tensor.dim()
        repeats[dim] = -(-new // old)
        tensor = tensor.repeat(repeats).narrow(dim, 0, new)
        grown_dims.append(dim)
    tensor = tensor.clone()
    if jitter and grown_dims and tensor.numel():
        tensor = _jittered(tensor, grown_dims, old, generator)
    return tensor


def _jittered(tensor, dims, old, generator):
    """``tensor`` (a fresh copy, may be written), grown by repeating along ``dims`` (each of size ``old`` before),
    with every element outside one copy of the sample moved a random fraction of the way towards the middle of the
    tensor's range.

    The copy kept exact is the last whole one along each dim, not the first: the sample's extreme values (a row's
    largest, the one a softmax or an argmax is about) then lie past the first block, where a streaming kernel must
    update what it found in the blocks before (an online softmax rescaling its running sum, an argmax adding the
    block's offset). Kept first, they would always be found in the first block, and such a bug never shows.
    """
    real = torch.view_as_real(tensor) if tensor.is_complex() else tensor
    values = real.detach().to(torch.float64)
    top, bottom = float(values.max()), float(values.min())
    if not (math.isfinite(top) and math.isfinite(bottom)):
        return tensor
    middle = (top + bottom) / 2
    low, high = JITTER
    if real.dtype == torch.float64:  # float32 fractions would tie copies of one value that draw the same one
        fraction = torch.rand(tuple(values.shape), generator=generator, dtype=torch.float64).to(values.device)
    else:
        fraction = uniform(tuple(values.shape), generator).to(values.device)
    fraction = fraction.mul_(high - low).add_(low)
    moved = values + fraction * (middle - values)

    def last_whole_copy(grown):
        for dim in dims:
            grown = grown.narrow(dim, (grown.shape[dim] // old - 1) * old, old)
        return grown

    last_whole_copy(moved).copy_(last_whole_copy(values))
    moved = moved.to(real.dtype)
    return torch.view_as_complex(moved) if tensor.is_complex() else moved
