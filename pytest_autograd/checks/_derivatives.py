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
(``_kinks``) from bugs by one-sided differences.
"""

from pytest_autograd.checks._jacobian import exhaustive
from pytest_autograd.checks._kinks import KinkNotes
from pytest_autograd.checks._numerical import (
    DerivativeError,
    Evaluator,
    unravel,
    with_others,
    worst_of,
)
from pytest_autograd.checks._patterns import mark_nonlinear
from pytest_autograd.checks._probing import probing
from pytest_autograd.engine.execution import grads_of, random_cotangents
from pytest_autograd.results.compare import fmt_index

EPS = 1e-6
ATOL = 1e-5
RTOL = 1e-3
EXHAUSTIVE_LIMIT = 1024  # elements in and out below which the full Jacobian is built


def find_derivative_error(fn, leaves, names, output_names, generator, atol=ATOL, rtol=RTOL, eps=EPS,
                          exhaustive_limit=EXHAUSTIVE_LIMIT, numerical_needs_grad=False, notes=None, outputs=None):
    """Return the worst DerivativeError, or None when derivatives agree.

    Kinks are added to ``notes`` (a KinkNotes), never reported as errors.
    ``outputs``: ``fn(leaves)`` when the caller already has it (with its
    graph), saving one evaluation.
    """
    outputs = fn(leaves) if outputs is None else outputs
    diff = [k for k, out in enumerate(outputs) if out.is_floating_point()]
    outputs = [outputs[k] for k in diff]
    output_names = [output_names[k] for k in diff]
    if not outputs or not leaves:
        return None
    notes = KinkNotes() if notes is None else notes
    evaluator = Evaluator(fn, leaves, diff, numerical_needs_grad)
    cotangents = random_cotangents(outputs, generator)
    analytical = grads_of(outputs, leaves, cotangents, retain_graph=True)
    n_in = sum(leaf.numel() for leaf in leaves)
    n_out = sum(out.numel() for out in outputs)
    if n_in <= exhaustive_limit and n_out <= exhaustive_limit:
        found = exhaustive(evaluator, leaves, outputs, output_names, names, cotangents, analytical, atol, rtol, eps,
                           notes)
    else:
        found = probing(evaluator, outputs, names, cotangents, analytical, generator, atol, rtol, eps, notes)
        if found is not None:  # probes judge one cotangent: say when backward is not even linear in it
            mark_nonlinear(found, _odd_in_grad_output(outputs, leaves, names, cotangents, analytical, atol, rtol))
    if found is None:
        found = _odd_in_grad_output(outputs, leaves, names, cotangents, analytical, atol, rtol)
    return found


def _odd_in_grad_output(outputs, leaves, names, cotangents, analytical, atol, rtol):
    """backward(-v) must be -backward(v): catches every sign-dependent backward.

    One random cotangent misses ``grad_output.clamp(min=0)`` whenever the few
    elements that matter happen to be positive; v and -v together never do.
    """
    negated = grads_of(outputs, leaves, [None if c is None else -c for c in cotangents], retain_graph=True)
    found = []
    for j, leaf in enumerate(leaves):
        expected = -analytical[j].detach().reshape(-1)
        got = negated[j].detach().reshape(-1)
        candidate = worst_of(expected[:, None], got[:, None], atol, rtol)
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
            argument_grad_all_zero=False, numerical_nonzero=True, expected_label="minus the one for grad_output",
            locus={"cotangents": [None if c is None else c.detach().clone() for c in cotangents], "negated": True,
                   "leaf": j, "element": unravel(e, leaf.shape)},
        ))
    return with_others(found)


def marker_tolerances(case):
    """``atol=``/``rtol=`` from the marker, as keywords for find_derivative_error."""
    return {name: case.option(name) for name in ("atol", "rtol") if case.option(name) is not None}


__all__ = ["ATOL", "EPS", "RTOL", "DerivativeError", "KinkNotes", "find_derivative_error", "marker_tolerances"]
