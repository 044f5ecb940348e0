"""Analytical vs numerical first derivatives of ``fn(leaves) -> outputs``.

Shared by gradcheck (fn is the op) and gradgradcheck (fn is the op's
backward). Two strategies:

* exhaustive, for small inputs: the full Jacobian both ways, every element;
* probing, for large ones: one backward along a random cotangent, then
  central differences for chosen coordinates (corners, first/last and tile
  boundaries of each dim, random ones) and random directions confined to
  slices. Cost is linear in the number of probes, never quadratic in size,
  and an error confined to an edge element or a slice is still caught,
  unlike a single random projection.

Both always include a random, sign-mixed, non-unit cotangent, so a backward
that is only right for positive grad_outputs fails.
"""

import math
from dataclasses import dataclass, field

import torch

from pytest_autograd.compare import dtype_label, fmt, fmt_index
from pytest_autograd.evidence import Evidence
from pytest_autograd.execution import grads_of, random_cotangents

EPS = 1e-6
ATOL = 1e-5
RTOL = 1e-3
EXHAUSTIVE_LIMIT = 1024  # elements in and out below which the full Jacobian is built
TILE_BOUNDARIES = (15, 16, 31, 32, 63, 64, 127, 128, 255, 256)
ELEMENT_PROBES = 16
SLICE_PROBES = 6


@dataclass
class DerivativeError:
    output: str
    argument: str
    element: str
    expected: float
    got: float
    abs_error: float
    tolerance: float
    strategy: str
    argument_grad_all_zero: bool
    numerical_nonzero: bool
    evidence: list = field(default_factory=list)  # the Jacobians behind it, for failure pictures

    def worst(self):
        return f"{self.element}: expected {fmt(self.expected)} (numerical), got {fmt(self.got)} (analytical)"

    def error_line(self):
        return f"abs error {fmt(self.abs_error)} > tolerance {fmt(self.tolerance)} ({self.strategy})"


def find_derivative_error(fn, leaves, names, output_names, generator, atol=ATOL, rtol=RTOL, eps=EPS,
                          exhaustive_limit=EXHAUSTIVE_LIMIT, numerical_needs_grad=False):
    """Return the worst DerivativeError, or None when derivatives agree."""
    outputs = fn(leaves)
    diff = [k for k, out in enumerate(outputs) if out.is_floating_point()]
    outputs = [outputs[k] for k in diff]
    output_names = [output_names[k] for k in diff]
    if not outputs or not leaves:
        return None
    numerical = _Numerical(fn, leaves, diff, eps, numerical_needs_grad)
    cotangents = random_cotangents(outputs, generator)
    analytical = grads_of(outputs, leaves, cotangents, retain_graph=True)
    n_in = sum(leaf.numel() for leaf in leaves)
    n_out = sum(out.numel() for out in outputs)
    if n_in <= exhaustive_limit and n_out <= exhaustive_limit:
        found = _exhaustive(outputs, leaves, names, output_names, numerical, cotangents, analytical, atol, rtol)
    else:
        found = _probing(leaves, names, numerical, cotangents, analytical, generator, atol, rtol)
    if found is None:
        found = _odd_in_grad_output(outputs, leaves, names, cotangents, analytical, atol, rtol)
    return found


def _odd_in_grad_output(outputs, leaves, names, cotangents, analytical, atol, rtol):
    """backward(-v) must be -backward(v): catches every sign-dependent backward.

    One random cotangent misses ``grad_output.clamp(min=0)`` whenever the few
    elements that matter happen to be positive; v and -v together never do.
    """
    negated = grads_of(outputs, leaves, [None if c is None else -c for c in cotangents], retain_graph=True)
    worst = None
    for j, leaf in enumerate(leaves):
        expected = -analytical[j].detach().reshape(-1)
        got = negated[j].detach().reshape(-1)
        candidate = _worst_of(expected[:, None], got[:, None], atol, rtol)
        if candidate is None:
            continue
        (e, _), want, have, error, tolerance = candidate
        found = DerivativeError(
            output="all outputs", argument=names[j],
            element=f"grad {names[j]}{fmt_index(_unravel(e, leaf.shape))} for -grad_output",
            expected=want, got=have, abs_error=error, tolerance=tolerance,
            strategy="negated random cotangent; the gradient for -grad_output must be minus the gradient for "
                     "grad_output, so backward is not linear in grad_output (e.g. right only for positive "
                     "grad_outputs)",
            argument_grad_all_zero=False, numerical_nonzero=True,
        )
        worst = _pick(worst, found)
    return worst


def below_float64(outputs):
    """Names of the dtypes of floating outputs computed in less than float64 precision.

    Such an op (a float32-only kernel, a ``.float()`` cast) returns float32
    for float64 inputs; central differences with eps=1e-6 then measure its
    rounding, not its derivative, so a correct op would fail.
    """
    return sorted({dtype_label(out.dtype) for out in outputs
                   if out.is_floating_point() and out.dtype != torch.float64})


def low_precision_reason(dtypes):
    return (f"the op returns {'/'.join(dtypes)} outputs for float64 inputs: finite differences of results rounded "
            "to that precision measure the rounding, not the derivative; give the op a float64 path to have its "
            "derivatives checked")


def marker_tolerances(case):
    """``atol=``/``rtol=`` from the marker, as keywords for find_derivative_error."""
    return {name: case.option(name) for name in ("atol", "rtol") if case.option(name) is not None}


class _Numerical:
    """Central differences of the op's outputs along a direction in one leaf."""

    def __init__(self, fn, leaves, diff, eps, needs_grad):
        self.fn, self.leaves, self.diff, self.eps = fn, leaves, diff, eps
        self.needs_grad = needs_grad  # True when fn itself differentiates (double backward)

    def difference(self, leaf_index, direction):
        def at(sign):
            moved = [leaf.detach() for leaf in self.leaves]
            moved[leaf_index] = moved[leaf_index] + sign * self.eps * direction
            with torch.set_grad_enabled(self.needs_grad):
                if self.needs_grad:
                    moved = [m.clone().requires_grad_(True) for m in moved]
                outputs = self.fn(moved)
            return [outputs[k].detach() for k in self.diff]

        plus, minus = at(1.0), at(-1.0)
        return [(p - m) / (2 * self.eps) for p, m in zip(plus, minus)]

    def projected(self, leaf_index, direction, cotangents):
        columns = self.difference(leaf_index, direction)
        return float(sum((column * v).sum() for column, v in zip(columns, cotangents)))


def _exhaustive(outputs, leaves, names, output_names, numerical, cotangents, analytical, atol, rtol):
    # Numerical Jacobian, one column per input element.
    numeric_columns = []  # [leaf][element] -> list of per-output flattened columns
    for j, leaf in enumerate(leaves):
        per_leaf = []
        for e in range(leaf.numel()):
            # torch.zeros, not zeros_like: a channels-last or transposed leaf gives a non-contiguous
            # zeros_like, which cannot be viewed flat.
            direction = torch.zeros(leaf.numel(), dtype=leaf.dtype, device=leaf.device)
            direction[e] = 1.0
            per_leaf.append([c.reshape(-1) for c in numerical.difference(j, direction.view(leaf.shape))])
        numeric_columns.append(per_leaf)
    worst = None
    for k, output in enumerate(outputs):
        rows = [torch.zeros(output.numel(), leaf.numel(), dtype=leaf.dtype, device=leaf.device) for leaf in leaves]
        for r in range(output.numel()):
            # Contiguous, so that the flat view works for non-contiguous outputs (a transpose, a permute).
            basis = [torch.zeros(o.shape, dtype=o.dtype, device=o.device) for o in outputs]
            basis[k].view(-1)[r] = 1.0
            for j, grad in enumerate(grads_of(outputs, leaves, basis, retain_graph=True)):
                rows[j][r] = grad.detach().reshape(-1)
        for j, leaf in enumerate(leaves):
            if leaf.numel():
                num = torch.stack([cols[k] for cols in numeric_columns[j]], dim=1)
            else:
                num = torch.zeros(output.numel(), 0, dtype=output.dtype, device=output.device)
            ana = rows[j]
            candidate = _worst_of(num, ana, atol, rtol)
            if candidate is None:
                continue
            (r, e), expected, got, error, tolerance = candidate
            out_index = fmt_index(_unravel(r, output.shape))
            in_index = fmt_index(_unravel(e, leaf.shape))
            found = DerivativeError(
                output=output_names[k], argument=names[j],
                element=f"d {output_names[k]}{out_index} / d {names[j]}{in_index}",
                expected=expected, got=got, abs_error=error, tolerance=tolerance,
                strategy="full Jacobian",
                argument_grad_all_zero=bool((ana == 0).all()),
                numerical_nonzero=bool((num != 0).any()),
                evidence=[Evidence.of(f"d {output_names[k]} / d {names[j]}", num, ana, (r, e), kind="jacobian")],
            )
            worst = _pick(worst, found)
    if worst is not None:
        return worst
    # Jacobians agree on the basis; now a sign-mixed random cotangent.
    for j, leaf in enumerate(leaves):
        num = torch.zeros(leaf.numel(), dtype=leaf.dtype, device=leaf.device)
        for e, columns in enumerate(numeric_columns[j]):
            num[e] = sum((column * v.reshape(-1)).sum() for column, v in zip(columns, cotangents))
        ana = analytical[j].detach().reshape(-1)
        candidate = _worst_of(num[:, None], ana[:, None], atol, rtol)
        if candidate is not None:
            (e, _), expected, got, error, tolerance = candidate
            found = DerivativeError(
                output="all outputs", argument=names[j],
                element=f"grad {names[j]}{fmt_index(_unravel(e, leaf.shape))}",
                expected=expected, got=got, abs_error=error, tolerance=tolerance,
                strategy="random sign-mixed cotangent; the Jacobian itself matched, so backward is "
                         "not linear in grad_output (e.g. right only for positive grad_outputs)",
                argument_grad_all_zero=bool((ana == 0).all()),
                numerical_nonzero=bool((num != 0).any()),
            )
            worst = _pick(worst, found)
    return worst


def _probing(leaves, names, numerical, cotangents, analytical, generator, atol, rtol):
    # A failed element probe names an exact coordinate: report it before any slice.
    worst = worst_slice = None
    for j, leaf in enumerate(leaves):
        grad = analytical[j].detach()
        all_zero = bool((grad == 0).all())
        for index in _element_probes(leaf.shape, generator):
            direction = torch.zeros_like(leaf)
            direction[index] = 1.0
            expected = numerical.projected(j, direction, cotangents)
            got = float(grad[index])
            found = _judge(expected, got, abs(expected), atol, rtol, names[j], f"grad {names[j]}{fmt_index(index)}",
                           "probed element along a random cotangent", all_zero)
            worst = _pick(worst, found)
        for label, mask in _slice_probes(leaf.shape, generator):
            direction = (torch.randn(leaf.shape, generator=generator, dtype=torch.float64) * mask).to(leaf)
            expected = numerical.projected(j, direction, cotangents)
            got = float((grad * direction).sum())
            scale = max(abs(expected), float((grad * direction).abs().sum()) * 1e-3)
            found = _judge(expected, got, scale, atol, rtol, names[j], f"grad {names[j]}{label} . random direction",
                           "random direction within a slice, along a random cotangent", all_zero)
            worst_slice = _pick(worst_slice, found)
    return worst if worst is not None else worst_slice


def _judge(expected, got, scale, atol, rtol, name, element, strategy, all_zero):
    error = abs(expected - got) if math.isfinite(got) else math.inf
    tolerance = atol + rtol * scale
    if error <= tolerance:
        return None
    return DerivativeError(
        output="all outputs", argument=name, element=element, expected=expected, got=got,
        abs_error=error, tolerance=tolerance, strategy=strategy,
        argument_grad_all_zero=all_zero, numerical_nonzero=expected != 0.0,
    )


def _pick(current, candidate):
    if candidate is None:
        return current
    if current is None:
        return candidate
    ratio = lambda d: d.abs_error / max(d.tolerance, 1e-300)  # noqa: E731
    return candidate if ratio(candidate) > ratio(current) else current


def _worst_of(numerical, analytical, atol, rtol):
    if numerical.numel() == 0:
        return None
    error = (numerical - analytical).abs()
    error = torch.where(error.isnan(), torch.full_like(error, math.inf), error)
    tolerance = atol + rtol * numerical.abs()
    ratio = error / tolerance
    flat = int(torch.argmax(ratio))
    if not bool(ratio.view(-1)[flat] > 1):
        return None
    position = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), numerical.shape))
    return position, float(numerical[position]), float(analytical[position]), float(error[position]), \
        float(tolerance[position])


def _unravel(flat, shape):
    if len(shape) == 0:
        return ()
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def _element_probes(shape, generator):
    """Coordinates where kernels go wrong: corners, edges, tile boundaries, random."""
    shape = tuple(shape)
    if any(size == 0 for size in shape):
        return []
    if not shape:
        return [()]
    probes = []

    def random_index():
        return [int(torch.randint(size, (1,), generator=generator)) for size in shape]

    probes.append(tuple(0 for _ in shape))
    probes.append(tuple(size - 1 for size in shape))
    for dim, size in enumerate(shape):
        for position in (0, size - 1) + tuple(b for b in TILE_BOUNDARIES if b < size - 1):
            index = random_index()
            index[dim] = position
            probes.append(tuple(index))
    while len(probes) < ELEMENT_PROBES:
        probes.append(tuple(random_index()))
    unique = list(dict.fromkeys(probes))
    if len(unique) > ELEMENT_PROBES:
        keep = torch.randperm(len(unique) - 2, generator=generator)[: ELEMENT_PROBES - 2]
        unique = unique[:2] + [unique[2 + int(i)] for i in sorted(keep)]
    return unique


def _slice_probes(shape, generator):
    """Masks selecting the first, last and a random slice of each dim, and everything."""
    shape = tuple(shape)
    if any(size == 0 for size in shape):
        return []
    probes = [("[...]", torch.ones(shape, dtype=torch.float64))]
    for dim, size in enumerate(shape):
        if len(shape) == 1:
            chunks = torch.linspace(0, size, steps=min(size, SLICE_PROBES) + 1).long().tolist()
            for start, stop in zip(chunks[:-1], chunks[1:]):
                mask = torch.zeros(shape, dtype=torch.float64)
                mask[start:stop] = 1.0
                probes.append((f"[{start}:{stop}]", mask))
            break
        positions = dict.fromkeys((0, size - 1, int(torch.randint(size, (1,), generator=generator))))
        for position in positions:
            mask = torch.zeros(shape, dtype=torch.float64)
            mask.select(dim, position).fill_(1.0)
            label = fmt_index([":" if d != dim else position for d in range(len(shape))])
            probes.append((label, mask))
    return probes[: 1 + SLICE_PROBES * max(1, len(shape))]
