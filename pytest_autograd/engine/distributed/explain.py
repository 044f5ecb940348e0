"""A failure across ranks, said in the ranks' terms: which rank holds the element, and what a pattern over the
ranks' shards suggests about the communication (an all-reduce too many, one missing, one rank's part only)."""

import re

RATIO_TOLERANCE = 0.02  # a gradient off by a constant factor on a shard: within this fraction of it everywhere


# A mapping whose backward sums the ranks' incoming gradients is right when each rank's is a partial sum in the model
PARTIAL_COTANGENT = ("; if in your model each rank's incoming gradient of the output is a partial sum (a gather or "
                     "copy feeding a column-parallel layer), say so: output_grad_placements=Partial() (here: {given})")


def _partial_cotangent(layout):
    """The PARTIAL_COTANGENT clause, unless every output's incoming gradient was handed as Partial already."""
    given = [layout.output_grad(index) for index in range(len(layout.outputs))]
    if all(placement.kind == "Partial" for placement in given):
        return ""
    return PARTIAL_COTANGENT.format(given=", ".join(str(placement) for placement in given))


def explain(report, case):
    """Add to ``report`` (a failure of a check on an AcrossRanks op) the rank of its worst element and, where the
    gradient is off by the world size (or its inverse), or zero, on every rank's shard, what that suggests."""
    layout = case.op.layout
    uneven = _uneven(case, layout)
    if uneven:
        report.details.append(uneven)
    slot = _slot(report.argument, layout)
    if slot is None:
        return
    placement = layout.input(slot)
    index = _index(report.worst, report.argument)
    shape = _shape(case, slot)
    if index is not None and shape is not None and len(index) == len(shape):
        from pytest_autograd.engine.distributed.placements import owner

        ranks, held = owner(placement, shape, index, layout.world_size)
        where = (f"rank {ranks[0]} holds it ({placement}: {_range(held)} of dim {held[0]})" if held else
                 f"every rank holds it ({placement})")
        report.details.append(f"`{report.argument}`[{', '.join(map(str, index))}] in global coordinates: {where}")
    hint = _pattern(report, layout, slot)
    if hint is not None:
        report.hint = hint


def _pattern(report, layout, slot):
    """What a constant factor of the world size, its inverse, or zeros on some ranks' shards suggest."""
    derivative = _derivative_factor(report, layout)
    if derivative is not None:
        return derivative
    evidence = next((e for e in report.evidence if e.kind == "tensor" and report.argument in e.label), None)
    if evidence is None or evidence.expected.shape != evidence.got.shape or not evidence.expected.numel():
        return None
    from pytest_autograd.engine.distributed.placements import shard

    name, size = report.argument, layout.world_size
    grad = layout.grad(slot)
    parts = list(zip(shard(evidence.expected, grad, size), shard(evidence.got, grad, size)))
    ratios = [_ratio(expected, got) for expected, got in parts if expected.numel()]
    if ratios and all(r is not None and abs(r - size) <= RATIO_TOLERANCE * size for r in ratios):
        return (f"the gradient of `{name}` is {size}x the reference on every rank ({size} ranks): the backward "
                "all-reduces a gradient that was already reduced (or every rank adds what one rank should)"
                + _partial_cotangent(layout))
    if ratios and all(r is not None and abs(r - 1 / size) <= RATIO_TOLERANCE / size for r in ratios):
        return (f"the gradient of `{name}` is 1/{size} of the reference on every rank: the backward averages what "
                "it must sum, or misses the all-reduce of the ranks' parts")
    zero = [rank for rank, (expected, got) in enumerate(parts)
            if got.numel() and bool((got == 0).all()) and bool((expected != 0).any())]
    if zero and len(zero) < size:
        return (f"the gradient of `{name}` is zero on the shard(s) of rank(s) {', '.join(map(str, zero))} and not on "
                "the others': only some ranks' parts reach it (a gather or scatter that drops ranks, ranks in the "
                "wrong order?)")
    return None


def _derivative_factor(report, layout):
    """For a gradient judged against finite differences of the whole op across ranks (gradcheck's hint names a
    factor between the analytical and the numerical one at every element), what a factor of the world size
    means."""
    cause = getattr(report.hint, "cause", None)
    if cause is None or getattr(report.hint, "confined", True):
        return None
    from pytest_autograd.checks._patterns import FACTORS

    factor = next((value for value, word in FACTORS.items() if word == cause), None)
    if factor is None and cause.endswith("x"):
        try:
            factor = float(cause[:-1])
        except ValueError:
            return None
    size, name = layout.world_size, report.argument
    if factor is None:
        return None
    if abs(factor - size) < 1e-9:
        return (f"the analytical gradient of `{name}` is {size}x the numerical one ({size} ranks): the backward "
                "all-reduces a gradient that was already reduced, every rank adds what one rank should, or the "
                f"forward divides by {size} what the backward does not (an average where a sum belongs)"
                + _partial_cotangent(layout))
    if abs(factor - 1 / size) < 1e-9:
        return (f"the analytical gradient of `{name}` is 1/{size} of the numerical one ({size} ranks): the forward "
                f"counts `{name}` once per rank (a bias added on every rank before the reduction?), or the backward "
                "misses the all-reduce of the ranks' parts")
    return None


def _ratio(expected, got):
    """got / expected where both are away from zero, when it is one number everywhere there; else None."""
    mask = expected.abs() > 1e-6 * max(float(expected.abs().max()), 1e-30)
    if not bool(mask.any()):
        return None
    ratios = got[mask] / expected[mask]
    middle = float(ratios.median())
    return middle if bool(((ratios - middle).abs() <= RATIO_TOLERANCE * abs(middle) + 1e-12).all()) else None


def _slot(name, layout):
    if name is None:
        return None
    if name in layout.names:
        return layout.names.index(name)
    return name if name in layout.inputs or name in layout.grads else None


def _index(worst, name):
    """The index of ``name``'s element a report's worst line names (``d output[0] / d weight[2, 3]``)."""
    if not worst or not name:
        return None
    found = re.findall(rf"{re.escape(name)}\[([\d,\s]+)\]", worst)
    if not found:
        return None
    return tuple(int(part) for part in found[-1].split(",") if part.strip())


def _uneven(case, layout):
    """What the samples shard unevenly over the ranks, in words (None if nothing): a layer written for even shards
    (an all_gather of equal parts) fails or crashes on them, through no fault of its maths."""
    size = layout.world_size
    for sample in case.samples:
        for slot, value in list(enumerate(sample.args)) + list(sample.kwargs.items()):
            placement = layout.input(slot) if isinstance(slot, str) or slot in layout.inputs else None
            if placement is None or placement.kind != "Shard" or not hasattr(value, "shape") or not value.dim():
                continue
            dim = placement.dim % value.dim()
            if value.shape[dim] % size:
                parts = [chunk.shape[dim] for chunk in value.chunk(size, dim)]
                return (f"`{layout.name(slot)}` is split unevenly: dim {dim} has {value.shape[dim]} over {size} ranks "
                        f"({', '.join(map(str, parts))}, as torch.chunk splits it); a layer written for even shards "
                        f"needs a global size its world divides: give samples whose dim {dim} is a multiple of {size}")
    return None


def _shape(case, slot):
    for sample in case.samples:
        value = sample.args[slot] if isinstance(slot, int) and slot < len(sample.args) else sample.kwargs.get(slot)
        if hasattr(value, "shape"):
            return tuple(value.shape)
    return None


def _range(held):
    _, start, stop = held
    return f"{start}..{stop - 1}"
