"""Run two implementations on the same sample and compare outputs and gradients.

Used by parity (device vs CPU) and reference (op vs reference). Both sides
get the same cotangent, so gradients are comparable element by element.
Every output and gradient is compared before failing, so the report names
each one that differs (the first in order, then "also ..." lines), each
with its own worst element.
"""

from dataclasses import dataclass

from pytest_autograd.checks._agreement import agree
from pytest_autograd.checks._loci import compare_locus
from pytest_autograd.engine.execution import OpRaised, grads_of, output_label, random_cotangents
from pytest_autograd.results.compare import compare_tensors
from pytest_autograd.results.evidence import Evidence


@dataclass
class Finding:
    """One output or gradient that differs, with what its report needs."""

    mismatch: object  # results.compare.Mismatch
    summary: str
    what: str
    fields: dict
    evidence: list
    hint: str = None
    locus: dict = None

    def also_line(self):
        worst = self.mismatch.worst(self.what)
        name = f"w.r.t. `{self.fields['argument']}`" if "argument" in self.fields else self.what
        if self.mismatch.problem:
            return f"also {name}: {worst}"
        return f"also {name}: {worst}; {self.mismatch.bad} of {self.mismatch.numel} elements differ"


def compare_runs(context, expected_side, got_side, expected_label, got_label, roles=None, cotangents=None):
    """Each side: (prepared, outputs). Fails naming every differing output and gradient, the first one first;
    else returns the gradients ``(expected, got)`` (None when no gradient was compared).

    ``roles``: what computes each side, ``("reference", "op")`` or ``("op", "op")`` (the op on two devices),
    for a script that recomputes a failure; None when a script could not (a compiled op). ``cotangents``: one per
    output (float64 on the CPU, None for non-floating ones); drawn here when not given.
    """
    (expected_prepared, expected_outputs), (got_prepared, got_outputs) = expected_side, got_side
    if len(expected_outputs) != len(got_outputs):
        context.fail(
            f"{got_label} returned {len(got_outputs)} tensor output(s), {expected_label} returned {len(expected_outputs)}",
        )
    count = len(expected_outputs)
    where = _Where(context, expected_prepared, expected_outputs, got_outputs, expected_label, got_label, roles)
    found = []
    for k, (expected, got) in enumerate(zip(expected_outputs, got_outputs)):
        label = output_label(k, count)
        if expected.dtype != got.dtype:
            _fail(context, found)
            context.fail(f"{label} of {got_label} has dtype {got.dtype}, {expected_label} gives {expected.dtype}",
                         output=label)
        finding = _compare(context, expected, got.to(expected.device), f"{label} of {got_label} differs from "
                           f"{expected_label}", label, {"output": label}, where.locus("output", k, None))
        if finding is not None:
            found.append(finding)
            if finding.mismatch.problem:  # a shape: gradients along a cotangent of the other shape mean nothing
                _fail(context, found)
    if cotangents is None:
        cotangents = random_cotangents(expected_outputs, context.generator, device="cpu")
    paired = [(k, e, g, c) for k, (e, g, c) in enumerate(zip(expected_outputs, got_outputs, cotangents))
              if c is not None and (e.requires_grad or g.requires_grad)]
    if not paired or not expected_prepared.leaves:
        _fail(context, found)
        return None
    for k, e, g, _ in paired:
        if e.requires_grad and not g.requires_grad:
            _fail(context, found)
            context.fail(f"{output_label(k, count)} of {got_label} does not require grad, but {expected_label}'s does",
                         output=output_label(k, count),
                         hint="forward returned a tensor detached from the graph, or marked it with "
                              "ctx.mark_non_differentiable: a loss computed from it then gets no gradient")
    try:
        expected_grads = grads_of([e for _, e, _, _ in paired], expected_prepared.leaves,
                                  [c.to(device=e.device, dtype=e.dtype) for _, e, _, c in paired])
        got_grads = grads_of([g for _, _, g, _ in paired], got_prepared.leaves,
                             [c.to(device=g.device, dtype=g.dtype) for _, _, g, c in paired])
    except OpRaised:
        _fail(context, found)  # a differing output is the first thing to fix
        raise
    where.cotangents = cotangents
    for j, (name, expected, got) in enumerate(zip(expected_prepared.names, expected_grads, got_grads)):
        finding = _compare(context, expected.detach(), got.detach().to(expected.device),
                           f"gradient w.r.t. `{name}` from {got_label} differs from {expected_label}", f"grad {name}",
                           {"argument": name}, where.locus("gradient", None, j), hint=_grad_hint)
        if finding is not None:
            found.append(finding)
    _fail(context, found)
    return [g.detach() for g in expected_grads], [g.detach() for g in got_grads]


class _Where:
    """Builds the locus of a finding (see ``_loci``) once its element is known."""

    def __init__(self, context, prepared, expected_outputs, got_outputs, expected_label, got_label, roles):
        self.context, self.prepared, self.roles = context, prepared, roles
        self.labels = (expected_label, got_label)
        self.devices = (str(expected_outputs[0].device), str(got_outputs[0].device)) if expected_outputs else None
        self.cotangents = None

    def locus(self, what, output, leaf):
        if self.roles is None:
            return None
        dtype = self.context.dtype
        return lambda mismatch: compare_locus(
            self.prepared, dtype, what, mismatch.index, mismatch, *self.labels, output=output, argument=leaf,
            cotangents=self.cotangents, devices=self.devices, fn=self.roles)


def _compare(context, expected, got, summary, what, fields, locus, hint=None):
    """A Finding when ``got`` differs from ``expected``, else None; ``hint(expected, got)`` is asked only then."""
    atol, rtol = context.tolerance(expected.dtype)
    if agree(expected, got, atol, rtol):
        return None
    mismatch = compare_tensors(expected, got, atol, rtol)
    if mismatch is None:
        return None
    hint = hint(expected, got) if hint is not None else None
    evidence = [Evidence.of(what, expected, got, mismatch.index)] if mismatch.problem is None else []
    return Finding(mismatch, summary, what, fields, evidence, hint,
                   locus(mismatch) if locus is not None and mismatch.problem is None else None)


def _fail(context, found):
    """Fail with the first finding, naming the others; nothing when there is none."""
    if not found:
        return
    first = found[0]
    context.fail(first.summary, worst=first.mismatch.worst(first.what), error=first.mismatch.error_line(),
                 hint=first.hint, evidence=[e for finding in found for e in finding.evidence],
                 details=[finding.also_line() for finding in found[1:]], locus=first.locus,
                 also=[{"argument": f.fields.get("argument"), "output": f.fields.get("output"),
                        "worst": f.mismatch.worst(f.what), "locus": f.locus} for f in found[1:]], **first.fields)


def _grad_hint(expected, got):
    if bool((got == 0).all()) and not bool((expected == 0).all()):
        return "the gradient is all zeros (backward returned None for this input?)"
    if expected.shape == got.shape and expected.dim() == 2 and expected.shape[0] == expected.shape[1]:
        if bool(((expected.transpose(0, 1) - got.to(expected.device)).abs() <= 1e-6 * (1 + expected.abs())).all()):
            return "the gradient is the transpose of the expected one"
    return None
