"""The exhaustive strategy for small inputs: the full Jacobian both ways, every element.

Numerically: two evaluations per input element, kept as right/left one-sided
columns so that kinks can be told from bugs. Analytically: one batched
backward over the whole basis of the outputs (``is_grads_batched``), or one
backward per output element when the op's backward cannot be batched.
"""

import warnings

import torch

from pytest_autograd.checks._domain_edges import DOMAIN_SHRINKS, edge_examples, well_inside
from pytest_autograd.checks._kinks import jump_mask, kink_mask
from pytest_autograd.checks._numerical import (
    DerivativeError,
    grads_again,
    index_label,
    pick,
    unravel,
    with_others,
    worst_of,
)
from pytest_autograd.checks._patterns import jacobian_pattern
from pytest_autograd.engine.execution import as_dense, grads_of
from pytest_autograd.results.compare import fmt_index
from pytest_autograd.results.evidence import Evidence

JUMP_COLUMNS = 256  # mismatching input elements re-measured with half the step


def exhaustive(evaluator, leaves, outputs, output_names, names, cotangents, analytical, atol, rtol, eps, notes):
    """The worst DerivativeError over every Jacobian element, or None; kinks go to ``notes``."""
    f0 = [out.detach() for out in outputs]
    central, right, left, steps = _numerical_jacobians(evaluator, f0, eps)
    outside = _outside(central, f0)
    rows = _analytical_jacobians(outputs, evaluator.base, leaves, cotangents, analytical, evaluator)
    worst = None
    kinks = [kink_mask(central[k], right[k], left[k], rows[k], atol, rtol) for k in range(len(outputs))]
    kinks = _confirmed_kinks(evaluator, f0, rows, kinks, right, left, atol, rtol, steps)
    # Not judged element by element: kinks, and elements outside the op's domain (said in the notes).
    unjudged = kinks if outside is None else [kink | outside.unsqueeze(0) for kink in kinks]
    jumps = _jumps(evaluator, f0, central, right, left, rows, unjudged, atol, rtol, steps)
    per_argument = {}  # each wrong argument's worst element, over every output
    for k, output in enumerate(outputs):
        mask = unjudged[k] | jumps[k]
        for j, name in enumerate(names):
            a, b = evaluator.offsets[j], evaluator.offsets[j + 1]
            num, ana = central[k][:, a:b], rows[k][:, a:b]
            candidate = worst_of(num, ana, atol, rtol, excluded=mask[:, a:b])
            if candidate is None:
                continue
            (r, e), expected, got, error, tolerance = candidate
            shape = evaluator.base[j].shape
            per_argument[j] = pick(per_argument.get(j), DerivativeError(
                output=output_names[k], argument=name,
                element=f"d {output_names[k]}{index_label(r, output.shape)} / d {name}{index_label(e, shape)}",
                expected=expected, got=got, abs_error=error, tolerance=tolerance, strategy="full Jacobian",
                argument_grad_all_zero=bool((ana == 0).all()), numerical_nonzero=bool((num != 0).any()),
                evidence=[Evidence.of(f"d {output_names[k]} / d {name}", num, ana, (r, e), kind="jacobian")],
                locus={"output": k, "row": unravel(r, output.shape), "leaf": j, "element": unravel(e, shape)},
                at=(j, e),
            ))
    for j, found in per_argument.items():
        a, b = evaluator.offsets[j], evaluator.offsets[j + 1]
        shape = evaluator.base[j].shape
        found.pattern = jacobian_pattern(
            torch.cat([c[:, a:b] for c in central]), torch.cat([r[:, a:b] for r in rows]), atol, rtol,
            torch.cat([(skip | jump)[:, a:b] for skip, jump in zip(unjudged, jumps)]),
            lambda column, j=j, shape=shape: f"grad {names[j]}{index_label(column, shape)}", shape)
    worst = with_others(per_argument.values())
    if worst is not None:
        return worst
    _note_domain(evaluator, names, steps, eps, outside, notes)
    _note_kinks(kinks, central, right, left, rows, outputs, output_names, evaluator, names, notes, notes.add)
    _note_kinks(jumps, central, right, left, rows, outputs, output_names, evaluator, names, notes, notes.add_jump)
    if any(bool(mask.any()) for mask in kinks):
        worst = _tied_direction(evaluator, f0, kinks, rows, outputs, output_names, names, cotangents, atol, rtol, eps)
        if worst is not None:
            return worst
    judged = torch.zeros(evaluator.numel, dtype=torch.bool, device=evaluator.device)
    for kink, jump in zip(kinks, jumps):
        judged |= (kink | jump).any(dim=0)
    if outside is not None:
        judged |= outside
    return _random_cotangent(evaluator, central, right, left, rows, cotangents, analytical, names, atol, rtol,
                             judged)


def _numerical_jacobians(evaluator, f0, eps):
    """Per output: central, right and left difference Jacobians, (numel_out, numel_in) each; and per input
    element the step its column was measured with.

    Where a step leaves the op's domain (its outputs turn inf/NaN while they are
    finite at the sample: ``sqrt`` of an element nearer 0 than the step), that
    column is measured again at finer steps (``well_inside``); a column
    still not finite at the finest is left as it is, for ``_outside`` to leave out.
    """
    n = evaluator.numel
    central = [torch.zeros(o.numel(), n, dtype=o.dtype, device=o.device) for o in f0]
    right = [torch.zeros_like(c) for c in central]
    left = [torch.zeros_like(c) for c in central]
    steps = [eps] * n
    domain = _finite(f0)  # outputs finite at the sample: a column that is not is the step's excursion
    for j, base in enumerate(evaluator.base):
        for e in range(base.numel()):
            h, plus, minus = _column(evaluator, j, e, eps, domain)
            column = evaluator.offsets[j] + e
            steps[column] = h
            for k, (p, m, o) in enumerate(zip(plus, minus, f0)):
                p, m, o = p.reshape(-1), m.reshape(-1), o.reshape(-1)
                central[k][:, column] = (p - m) / (2 * h)
                right[k][:, column] = (p - o) / h
                left[k][:, column] = (o - m) / h
    return central, right, left, steps


def _column(evaluator, j, e, eps, domain):
    """(step, outputs at +step, at -step) for element ``e`` of leaf ``j``: ``eps`` when both are finite there, else
    (``domain``) a finer step well inside the op's domain (``well_inside``), else the finest tried."""
    base = evaluator.base[j]

    def measure(h):
        # torch.zeros, not zeros_like: a channels-last leaf gives a non-contiguous zeros_like.
        step = torch.zeros(base.numel(), dtype=base.dtype, device=base.device)
        step[e] = h
        moved = [None] * len(evaluator.base)
        moved[j] = step.view(base.shape)
        plus = evaluator.at(moved)
        moved[j] = -moved[j]
        minus = evaluator.at(moved)
        return _finite(plus) and _finite(minus), (h, plus, minus)

    finite, found = measure(eps)
    return found if finite or not domain else well_inside(measure, eps)[1]


def _finite(tensors):
    return all(bool(t.isfinite().all()) for t in tensors if t.is_floating_point())


def _outside(central, f0):
    """Input elements whose columns are not finite at their finest step, where the outputs at the sample are: the
    op's domain ends nearer than that step (a bool mask over the input elements; None when there are none)."""
    if not _finite(f0) or not central:
        return None
    outside = torch.zeros(central[0].shape[1], dtype=torch.bool, device=central[0].device)
    for c in central:
        outside |= ~c.isfinite().all(dim=0)
    return outside if bool(outside.any()) else None


def _note_domain(evaluator, names, steps, eps, outside, notes):
    """Say which elements were measured with a finer step, or not at all, because the step left the op's domain."""
    finer = [column for column, h in enumerate(steps) if h < eps and (outside is None or not bool(outside[column]))]
    if finer:
        j, _ = evaluator.leaf_of(finer[0])
        notes.add_domain_step(f"moving single elements of `{names[j]}`", eps, min(steps[c] for c in finer))
    if outside is not None:
        notes.add_domain_edges(int(outside.sum()), edge_examples(evaluator, names, outside.nonzero().flatten().tolist()),
                               eps / DOMAIN_SHRINKS[-1])


def _confirmed_kinks(evaluator, f0, rows, kinks, right, left, atol, rtol, steps):
    """The kink masks, less the elements whose one-sided gap halves with the step while the central difference at
    half the step still disagrees: strong curvature (``sqrt`` just inside its domain), not a kink, so the mismatch
    is judged. A kink's gap stays whatever the step; only the first ``JUMP_COLUMNS`` columns are measured again."""
    columns = torch.zeros(evaluator.numel, dtype=torch.bool, device=evaluator.device)
    for kink in kinks:
        columns |= kink.any(dim=0)
    for column in columns.nonzero().flatten().tolist()[:JUMP_COLUMNS]:
        h, plus, minus = _at_half_step(evaluator, steps, column)
        for k, (p, m, o) in enumerate(zip(plus, minus, f0)):
            p, m, o = p.reshape(-1), m.reshape(-1), o.reshape(-1)
            central = (p - m) / (2 * h)
            agrees = (central - rows[k][:, column]).abs() <= atol + rtol * central.abs()
            stays = ((p - o) / h - (o - m) / h).abs() > 0.75 * (right[k][:, column] - left[k][:, column]).abs()
            kinks[k][:, column] &= stays | agrees
    return kinks


def _at_half_step(evaluator, steps, column):
    """(half the column's step, outputs moved by it along that input element, and against it)."""
    h = steps[column] / 2
    step = torch.zeros(evaluator.numel, dtype=evaluator.dtype, device=evaluator.device)
    step[column] = h
    return h, evaluator.at_flat(step), evaluator.at_flat(-step)


def _jumps(evaluator, f0, central, right, left, rows, kinks, atol, rtol, steps):
    """Masks of mismatches (not kinks) where a one-sided difference grows like 1/eps: half steps (of each column's
    own), those columns only."""
    masks = [torch.zeros_like(kink) for kink in kinks]
    suspects = torch.zeros(evaluator.numel, dtype=torch.bool, device=evaluator.device)
    for k, kink in enumerate(kinks):
        mismatch = (central[k] - rows[k]).abs() > atol + rtol * central[k].abs()
        suspects |= (mismatch & ~kink).any(dim=0)
    columns = suspects.nonzero().flatten().tolist()[:JUMP_COLUMNS]
    for column in columns:
        h, plus, minus = _at_half_step(evaluator, steps, column)
        for k, (p, m, o) in enumerate(zip(plus, minus, f0)):
            p, m, o = p.reshape(-1), m.reshape(-1), o.reshape(-1)
            tolerance = atol + rtol * central[k][:, column].abs()
            masks[k][:, column] = jump_mask(right[k][:, column], left[k][:, column], (p - o) / h, (o - m) / h,
                                            tolerance) & ~kinks[k][:, column]
    return masks


def _analytical_jacobians(outputs, bases, leaves, cotangents, analytical, evaluator=None):
    """Per output: the analytical Jacobian (numel_out, numel_in), by one batched backward when possible.

    A backward that cannot run twice on one graph gets a fresh graph per row (``grads_again``).
    """
    rows = _batched_rows(outputs, leaves, cotangents, analytical)
    if rows is not None:
        return rows
    rows = [torch.zeros(o.numel(), sum(b.numel() for b in bases), dtype=o.dtype, device=o.device) for o in outputs]
    for k, output in enumerate(outputs):
        for r in range(output.numel()):
            # Contiguous, so that the flat view works for non-contiguous outputs (a transpose, a permute).
            basis = [torch.zeros(o.shape, dtype=o.dtype, device=o.device) for o in outputs]
            basis[k].view(-1)[r] = 1.0
            grads = grads_of(outputs, leaves, basis, retain_graph=True) if evaluator is None else \
                grads_again(outputs, leaves, basis, evaluator)
            rows[k][r] = torch.cat([g.detach().reshape(-1) for g in grads]) if grads else rows[k][r]
    return rows


def _batched_rows(outputs, leaves, cotangents, analytical):
    """All basis backwards in one ``is_grads_batched`` call; None when the backward cannot be batched.

    The result is trusted only if its rows, weighted by the random cotangent,
    add up to the plain backward along that cotangent.
    """
    pairs = [(k, o) for k, o in enumerate(outputs) if o.requires_grad]
    total = sum(o.numel() for o in outputs)
    if not pairs or total == 0 or not leaves:
        return None
    eye = torch.eye(total, dtype=outputs[0].dtype, device=outputs[0].device)
    starts = [0]
    for o in outputs:
        starts.append(starts[-1] + o.numel())
    batched = [eye[:, starts[k]:starts[k + 1]].reshape(total, *o.shape).to(o.dtype) for k, o in pairs]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads = torch.autograd.grad([o for _, o in pairs], leaves, batched, retain_graph=True,
                                        allow_unused=True, is_grads_batched=True)
    except Exception:  # noqa: BLE001 - any refusal means: fall back to one backward per row
        return None
    flat = torch.cat([torch.zeros(total, leaf.numel(), dtype=leaf.dtype, device=leaf.device) if g is None
                      else as_dense(g).detach().reshape(total, -1) for leaf, g in zip(leaves, grads)], dim=1)
    v = torch.cat([c.reshape(-1) if c is not None else torch.zeros(o.numel(), dtype=o.dtype, device=o.device)
                   for c, o in zip(cotangents, outputs)])
    expected = torch.cat([a.detach().reshape(-1) for a in analytical])
    if not torch.allclose(v @ flat, expected, rtol=1e-7, atol=1e-9, equal_nan=True):
        return None
    return [flat[starts[k]:starts[k + 1]] for k in range(len(outputs))]


def _note_kinks(kinks, central, right, left, rows, outputs, output_names, evaluator, names, notes, add):
    count = sum(int(mask.sum()) for mask in kinks)
    if not count:
        return
    for k, mask in enumerate(kinks):
        if mask.any():
            r, c = (int(i) for i in mask.nonzero()[0])
            j, index = evaluator.leaf_of(c)
            example = f"d {output_names[k]}{index_label(r, outputs[k].shape)} / d {names[j]}{fmt_index(index)}"
            add(count, example, float(left[k][r, c]), float(right[k][r, c]), float(rows[k][r, c]))
            return


def _tied_direction(evaluator, f0, kinks, rows, outputs, output_names, names, cotangents, atol, rtol, eps):
    """Move every kink element at once: where that direction is smooth, the gradients must add up.

    For max with k tied values, each tied element alone is a kink (right
    derivative 1, left 0), so a backward giving each of them the full
    gradient passes element by element; moving all of them together changes
    the max at rate exactly 1, which such a backward gets k times too large.
    """
    columns = torch.zeros(evaluator.numel, dtype=torch.bool, device=evaluator.device)
    for mask in kinks:
        columns |= mask.any(dim=0)
    direction = columns.to(evaluator.dtype)
    plus = evaluator.at_flat(eps * direction)
    minus = evaluator.at_flat(-eps * direction)
    half_plus = evaluator.at_flat(eps / 2 * direction)
    half_minus = evaluator.at_flat(-eps / 2 * direction)
    moved = int(columns.sum())
    worst = None
    for k, output in enumerate(outputs):
        p, m, o = plus[k].reshape(-1), minus[k].reshape(-1), f0[k].reshape(-1)
        central, right, left = (p - m) / (2 * eps), (p - o) / eps, (o - m) / eps
        half = (half_plus[k].reshape(-1) - half_minus[k].reshape(-1)) / eps
        analytical = rows[k] @ direction
        tolerance = atol + rtol * central.abs()
        smooth = ((right - left).abs() <= tolerance) & ((half - central).abs() <= tolerance)
        candidate = worst_of(central, analytical, atol, rtol, excluded=~smooth)
        if candidate is None:
            continue
        (r,), expected, got, error, tol = candidate
        j = next(j for j in range(len(names)) if columns[evaluator.offsets[j]:evaluator.offsets[j + 1]].any())
        worst = pick(worst, DerivativeError(
            output=output_names[k], argument=names[j],
            element=f"d {output_names[k]}{index_label(r, output.shape)} along all {moved} kink elements moved together",
            expected=expected, got=got, abs_error=error, tolerance=tol,
            strategy="every kink element moved together, a direction where the left and right derivatives agree: "
                     "the gradients of tied elements must add up to it",
            argument_grad_all_zero=False, numerical_nonzero=expected != 0.0, smooth=True,
            locus={"output": k, "row": unravel(r, output.shape), "leaf": j,
                   "direction": [part.clone() for part in evaluator.split(direction)]},
        ))
    return worst


def _random_cotangent(evaluator, central, right, left, rows, cotangents, analytical, names, atol, rtol, judged):
    """Jacobians agree on the basis; now the sign-mixed random cotangent (linearity in grad_output).

    Each Jacobian element passed within ``atol + rtol |numerical|``, so their
    combination ``v . J`` may be off by the same combination of allowances,
    over the elements where either Jacobian is not zero: a plain ``atol`` here
    failed a correct float32-computing op whose within-tolerance errors added up.
    """
    v = [c.reshape(-1) for c in cotangents]
    num = sum(vk @ c for vk, c in zip(v, central))
    num_right = sum(vk @ c for vk, c in zip(v, right))
    num_left = sum(vk @ c for vk, c in zip(v, left))
    allowed = atol + sum(vk.abs() @ ((atol + rtol * c.abs()) * ((c != 0) | (r != 0)))
                         for vk, c, r in zip(v, central, rows))
    ana = torch.cat([a.detach().reshape(-1) for a in analytical])
    kinks = kink_mask(num, num_right, num_left, ana, atol, rtol) | judged  # kinks and jumps were noted above
    found = []
    for j, name in enumerate(names):
        a, b = evaluator.offsets[j], evaluator.offsets[j + 1]
        candidate = _worst_beyond(num[a:b], ana[a:b], allowed[a:b], kinks[a:b])
        if candidate is None:
            continue
        e, expected, got, error, tolerance = candidate
        found.append(DerivativeError(
            output="all outputs", argument=name, element=f"grad {name}{index_label(e, evaluator.base[j].shape)}",
            expected=expected, got=got, abs_error=error, tolerance=tolerance,
            strategy="random sign-mixed cotangent; the Jacobian itself matched, so backward is "
                     "not linear in grad_output (e.g. right only for positive grad_outputs)",
            argument_grad_all_zero=bool((ana[a:b] == 0).all()), numerical_nonzero=bool((num[a:b] != 0).any()),
            locus={"cotangents": [None if c is None else c.detach().clone() for c in cotangents], "leaf": j,
                   "element": unravel(e, evaluator.base[j].shape)},
            at=(j, e),
        ))
    return with_others(found)


def _worst_beyond(numerical, analytical, allowed, excluded):
    """(flat index, numerical, analytical, error, allowed) of the element furthest beyond its own ``allowed``
    error, or None when every element not ``excluded`` is within it."""
    error = (numerical - analytical).abs()
    error = torch.where(error.isnan(), torch.full_like(error, float("inf")), error)
    ratio = error / allowed
    ratio = torch.where(ratio.isnan(), torch.full_like(ratio, float("inf")), ratio)  # NaN hides no other element
    ratio = torch.where(excluded, torch.zeros_like(error), ratio)
    if ratio.numel() == 0 or not bool(ratio.max() > 1):
        return None
    e = int(torch.argmax(ratio))
    return e, float(numerical[e]), float(analytical[e]), float(error[e]), float(allowed[e])
