"""Analytical vs numerical first derivatives of ``fn(leaves) -> outputs``.

Shared by gradcheck (fn is the op) and gradgradcheck (fn is the op's
backward). Two strategies:

* exhaustive, for small inputs (``_jacobian``): the full Jacobian both ways,
  every element, the analytical one by a single batched backward;
* probing, for large ones (``_probing``): random directions over every
  element of every argument at once, with a tolerance from the measured
  finite-difference error, and group testing that names the wrong element.
  Cost is a handful of evaluations, whatever the size.

Both always include a random, sign-mixed, non-unit cotangent, so a backward
that is only right for positive grad_outputs fails, and both tell kinks
(``_kinks``) from bugs by one-sided differences. A failure at a point where
an argument holds tied values is judged again where selections cannot flip
(``_ties``): along every tie group moved together, and at a tie-free point.
"""

import torch

from pytest_autograd.checks._jacobian import exhaustive
from pytest_autograd.checks._kinks import KinkNotes
from pytest_autograd.checks._numerical import (
    DerivativeError,
    Evaluator,
    grads_again,
    projected_difference,
    unravel,
    with_others,
    worst_of,
)
from pytest_autograd.checks._patterns import mark_nonlinear
from pytest_autograd.checks._probing import probing
from pytest_autograd.checks._same_draws import default_draws, with_same_draws
from pytest_autograd.checks._ties import find_ties, group_direction, tie_free
from pytest_autograd.engine.execution import grads_of, random_cotangents
from pytest_autograd.results.compare import fmt_index

EPS = 1e-6
ATOL = 1e-5
RTOL = 1e-3
EXHAUSTIVE_LIMIT = 1024  # elements in and out below which the full Jacobian is built


def find_derivative_error(fn, leaves, names, output_names, generator, atol=ATOL, rtol=RTOL, eps=EPS,
                          exhaustive_limit=EXHAUSTIVE_LIMIT, numerical_needs_grad=False, notes=None, outputs=None,
                          judge_ties=True, nondifferentiable=(), precomputed=None, draws=None):
    """Return the worst DerivativeError, or None when derivatives agree.

    Kinks and ties are added to ``notes`` (a KinkNotes), never reported as
    errors. ``outputs``: ``fn(leaves)`` when the caller already has it (with
    its graph), saving one evaluation. ``nondifferentiable``: positions of outputs the op declares
    non-differentiable (see ``declared_nondifferentiable``), not judged. ``precomputed`` (a
    ``_numerical.Precomputed``): the cotangents, analytical gradients and first probes another computation of
    the same sample made. ``draws`` (a ``_same_draws.Draws``): where every evaluation of ``fn`` starts its random
    numbers, so an op drawing them draws alike in each; ``outputs`` and ``precomputed``, when given, must come from
    evaluations started from it too.
    """
    draws = default_draws(leaves) if draws is None else draws
    fn = with_same_draws(fn, draws)
    outputs = fn(leaves) if outputs is None else outputs
    diff = [k for k, out in enumerate(outputs) if out.is_floating_point() and k not in nondifferentiable]
    outputs = [outputs[k] for k in diff]
    output_names = [output_names[k] for k in diff]
    if not outputs or not leaves:
        return None
    notes = KinkNotes() if notes is None else notes
    evaluator = Evaluator(fn, leaves, diff, numerical_needs_grad)
    if precomputed is not None and precomputed.cotangents is not None:
        cotangents, analytical = precomputed.cotangents, precomputed.analytical
    else:
        cotangents = random_cotangents(outputs, generator)
        # Copies: a memory-saving backward returns the very buffers forward saved, which its next run overwrites.
        analytical = [g.clone() for g in grads_of(outputs, leaves, cotangents, retain_graph=True)]
    negated = _negated_grads(outputs, leaves, cotangents, analytical, evaluator, atol, rtol)
    if precomputed is not None and evaluator.spent_by_backward and precomputed.on_spent is not None:
        precomputed.on_spent()
    if precomputed is not None and precomputed.eps not in (None, eps):
        precomputed = None  # its probes moved by another step
    n_in = sum(leaf.numel() for leaf in leaves)
    n_out = sum(out.numel() for out in outputs)
    probe_kinks = notes.probe_kinks
    if n_in <= exhaustive_limit and n_out <= exhaustive_limit:
        found = exhaustive(evaluator, leaves, outputs, output_names, names, cotangents, analytical, atol, rtol, eps,
                           notes)
    else:
        found = probing(evaluator, outputs, names, cotangents, analytical, generator, atol, rtol, eps, notes,
                        precomputed=precomputed)
        if found is not None:  # probes judge one cotangent: say when backward is not even linear in it
            mark_nonlinear(found, _odd_in_grad_output(leaves, names, cotangents, analytical, negated, atol, rtol))
    if found is None:
        found = _odd_in_grad_output(leaves, names, cotangents, analytical, negated, atol, rtol)
    # A failure, or random probes let through at kinks, where ties may explain them: judged where none flips.
    crossed = found is None and notes.probe_kinks > probe_kinks
    if judge_ties and (crossed or (found is not None and not found.smooth)):
        found = _around_ties(found, evaluator, outputs, cotangents, analytical, generator, names, output_names,
                             notes, atol=atol, rtol=rtol, eps=eps, exhaustive_limit=exhaustive_limit,
                             numerical_needs_grad=numerical_needs_grad, nondifferentiable=nondifferentiable,
                             draws=draws)
    return found


def _around_ties(found, evaluator, outputs, cotangents, analytical, generator, names, output_names, notes,
                 **options):
    """A failure (or None: probes passed at kinks) where arguments hold tied values, judged where no selection
    flips; None (noted) when right there.

    First at a tie-free point (a wrong gradient away from ties fails there,
    naming its element), then along every tie group moved together at the
    tied point (smooth there: the gradients of tied elements must add up).
    No tie, or no safe tie-breaking step: ``found`` stands.
    """
    ties = find_ties(evaluator.base, names)
    if not ties or (found is not None and found.at is not None and not ties.holds(*found.at)):
        return found  # no tie, or the failing element is not tied: moving it alone flips no selection
    atol, rtol, eps = options["atol"], options["rtol"], options["eps"]
    moved = tie_free(evaluator.base, ties, generator, eps)
    if moved is None:
        return found
    moved = [m.requires_grad_(True) for m in moved]
    again = find_derivative_error(evaluator.fn, moved, names, output_names, generator, notes=notes,
                                  judge_ties=False, **options)
    if again is not None:
        again.strategy += ("; at a tie-free point: the sample's tied values in " + ", ".join(
            f"`{n}`" for n, c in zip(names, ties.counts) if c) + " moved apart by less than half the gap to any "
            "other value, so no selection flips and the failure is not the tie's")
        again.smooth = True
        return again
    along = _along_tie_groups(evaluator, outputs, cotangents, analytical, ties, generator, names, atol, rtol, eps)
    if along is not None:
        return along
    notes.add_ties(ties.describe(names), found.worst() if found is not None else "random probes crossed them")
    return None


def _along_tie_groups(evaluator, outputs, cotangents, analytical, ties, generator, names, atol, rtol, eps):
    """Every tie group moved rigidly: the projected central difference must match the analytical one there."""
    direction = group_direction(evaluator.base, ties, generator)
    f0 = [out.detach() for out in outputs]
    scaled = lambda h: evaluator.at([h * d for d in direction])  # noqa: E731
    plus, minus, half_plus, half_minus = scaled(eps), scaled(-eps), scaled(eps / 2), scaled(-eps / 2)
    central = projected_difference(cotangents, plus, minus) / (2 * eps)
    right = projected_difference(cotangents, plus, f0) / eps
    left = projected_difference(cotangents, f0, minus) / eps
    half = projected_difference(cotangents, half_plus, half_minus) / eps
    expected = sum(float(torch.dot(a.detach().reshape(-1).to(torch.float64), d.reshape(-1).to(torch.float64)))
                   for a, d in zip(analytical, direction))
    tolerance = atol + rtol * abs(central)
    smooth = abs(right - left) <= tolerance and abs(half - central) <= tolerance
    if not smooth or abs(expected - central) <= tolerance:
        return None
    moved = [n for n, c in zip(names, ties.counts) if c]
    return DerivativeError(
        output="all outputs", argument=moved[0],
        element=f"every tie group of {', '.join(f'`{n}`' for n in moved)} moved together",
        expected=central, got=expected, abs_error=abs(expected - central), tolerance=tolerance,
        strategy="each tie group moved rigidly at its own rate, a direction where no selection flips (left and "
                 "right derivatives agree): the gradients of tied elements must add up to its derivative",
        argument_grad_all_zero=False, numerical_nonzero=central != 0.0, smooth=True,
    )


def _negated_grads(outputs, leaves, cotangents, analytical, evaluator, atol, rtol):
    """backward(-v), for the linearity test; taken first, because it also tells whether backward spoils its own
    graph.

    A kernel that writes the gradients into the buffers forward saved (a
    memory-saving backward) bumps no version counter: torch's second
    backward on that graph runs, on the first one's gradients. When
    backward(-v) is not -backward(v) there but is on a graph of its own,
    that is the cause, and every later backward gets a fresh graph.
    """
    flipped = [None if c is None else -c for c in cotangents]
    negated = grads_again(outputs, leaves, flipped, evaluator)
    if not evaluator.spent_by_backward and _opposite_mismatches(analytical, negated, atol, rtol):
        fresh = evaluator.grads_on_a_fresh_graph(flipped)
        if not _opposite_mismatches(analytical, fresh, atol, rtol):
            evaluator.spent_by_backward = True
            negated = fresh
    return negated


def _opposite_mismatches(analytical, negated, atol, rtol):
    """Per leaf, the worst element where ``negated`` is not ``-analytical`` (None where it is).

    Negation is exact in floating point, so a backward linear in
    ``grad_output`` usually gives exactly the negated gradients: one
    comparison of every element decides that, before the tolerance's passes.
    """
    found = []
    for a, n in zip(analytical, negated):
        minus = -a.detach()
        n = n.detach()
        if torch.equal(minus, n):  # the usual case; NaN fails it, and is then matched with NaN below
            found.append(None)
            continue
        both_nan = minus.isnan() & n.isnan()  # NaN both ways is no sign dependence (gradcheck judges the NaN)
        if bool(both_nan.any()):
            minus, n = minus.masked_fill(both_nan, 0.0), n.masked_fill(both_nan, 0.0)
        found.append(None if torch.equal(minus, n) else
                     worst_of(minus.reshape(-1)[:, None], n.reshape(-1)[:, None], atol, rtol))
    return found if any(f is not None for f in found) else None


def _odd_in_grad_output(leaves, names, cotangents, analytical, negated, atol, rtol):
    """backward(-v) must be -backward(v): catches every sign-dependent backward.

    One random cotangent misses ``grad_output.clamp(min=0)`` whenever the few
    elements that matter happen to be positive; v and -v together never do.
    """
    found = []
    for j, (leaf, candidate) in enumerate(zip(leaves, _opposite_mismatches(analytical, negated, atol, rtol) or [])):
        if candidate is None:
            continue
        (e, _), want, have, error, tolerance = candidate
        found.append(DerivativeError(
            output="all outputs", argument=names[j],
            element=f"grad {names[j]}{fmt_index(unravel(e, leaf.shape))} for -grad_output",
            expected=want, got=have, abs_error=error, tolerance=tolerance,
            strategy="negated random cotangent; the gradient for -grad_output must be minus the gradient for "
                     "grad_output, so backward is not linear in grad_output (e.g. right only for positive "
                     "grad_outputs)",
            argument_grad_all_zero=False, numerical_nonzero=True, smooth=True,
            expected_label="minus the one for grad_output",
            locus={"cotangents": [None if c is None else c.detach().clone() for c in cotangents], "negated": True,
                   "leaf": j, "element": unravel(e, leaf.shape)},
        ))
    return with_others(found)


def marker_tolerances(case):
    """``atol=``/``rtol=`` from the marker, as keywords for find_derivative_error."""
    return {name: case.option(name) for name in ("atol", "rtol") if case.option(name) is not None}


__all__ = ["ATOL", "EPS", "RTOL", "DerivativeError", "KinkNotes", "find_derivative_error", "marker_tolerances"]
