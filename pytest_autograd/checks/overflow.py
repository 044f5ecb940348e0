"""overflow: an inf or NaN in grad_output reaches every gradient element it flows into, as the reference's does.

Mixed-precision training scales the loss up so 16-bit gradients do not
underflow, and ``torch.amp.GradScaler`` skips the optimizer step when the
scale was too large: it looks for an inf or NaN in the gradients. A backward
that clamps ``grad_output`` (to the float16 range), ``nan_to_num``s it, masks
its non-finite values or saturates it with a NaN-dropping ``fmax``/``fmin``
hides the overflow: the scaler then applies a garbage step instead of
skipping it, and never lowers the scale.

Per sample, starting from the plain run's cotangents (``_plain_run``), one
element of each differentiable output's cotangent is set to a large finite
value: the gradient elements that move are the ones backward reads it into.
Then that element is set to inf, and then to NaN: each of those gradient
elements must be non-finite, wherever the reference's gradient is too (with
``reference=``). A gradient that is finite where the reference's is finite
(a ``torch.where`` that leaves masked elements at zero, where ``grad * mask``
would give ``inf * 0 = NaN``) passes.
"""

import math
import warnings

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._training_runs import run_in
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import OpRaised, constants_only_reason, has_floating_input, output_label
from pytest_autograd.results.compare import dtype_label, fmt, fmt_index, unravel
from pytest_autograd.results.evidence import Evidence

HINT = ("do not clamp `{name}`, nan_to_num it, mask its non-finite values or saturate it with fmax/fmin: an inf or "
        "NaN there must reach the gradients, so torch.amp.GradScaler sees the overflow and skips the step (clamp or "
        "saturate the values you store, after the gradient is computed, if a format needs it)")
LARGE = 2.0 ** 20  # the finite value that finds where a cotangent element flows (less in float16: _large)
REACHED = 1e-3  # a gradient element is reached where it moves by more than this share of the largest move
FLOATING_POINT_WARNINGS = r"(invalid value|overflow|divide by zero) encountered"  # numpy's, on inf and NaN


class Overflow(Check):
    name = "overflow"
    description = ("an inf or NaN in grad_output (an overflowing loss scale) reaches every gradient element it "
                   "flows into, as it does the reference's")

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument: there is no gradient to carry an overflow"
        return constants_only_reason(case)

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            plain = plain_run(context, index, prepared)
            if plain.differentiable:
                _judge(context, prepared, plain)


def _judge(context, prepared, plain):
    with warnings.catch_warnings():  # numpy (Triton's interpreter, an op's own numpy) warns on the values it was given
        warnings.filterwarnings("ignore", FLOATING_POINT_WARNINGS, RuntimeWarning)
        _judge_overflows(context, prepared, plain)


def _judge_overflows(context, prepared, plain):
    chosen = {k: int(torch.randint(0, c.numel(), (1,), generator=context.generator))
              for k, c in enumerate(plain.drawn) if c is not None and c.numel()}
    if not chosen:
        return
    _, probed = run_in(context, prepared, plain, cotangents=_with(plain, chosen, None))
    reached = [_reached(before, after) for before, after in zip(plain.grads, probed)]
    if not any(bool(r.any()) for r in reached):
        return  # backward reads none of the chosen elements: nothing can be hidden from it
    for value in (math.inf, math.nan):
        cotangents = _with(plain, chosen, value)
        _, got = run_in(context, prepared, plain, cotangents=cotangents)
        expected = _reference_nonfinite(context, prepared, plain, cotangents)
        for name, grad, where, ref in zip(prepared.names, got, reached, expected or [None] * len(got)):
            required = where if ref is None else where & ref
            hidden = required & torch.isfinite(grad)
            if bool(hidden.any()):
                _fail(context, plain, chosen, value, name, grad, hidden, required, ref)


def _with(plain, chosen, value):
    """The plain run's cotangents with each chosen element set to ``value`` (None: moved by a large finite one)."""
    cotangents = plain.cotangents
    for k, flat in chosen.items():
        at = unravel(flat, tuple(cotangents[k].shape))
        cotangents[k][at] = cotangents[k][at] + _large(cotangents[k].dtype) if value is None else value
    return cotangents


def _large(dtype):
    """A finite value far above the cotangent's own scale that ``dtype`` holds with room to spare."""
    return min(LARGE, 2.0 ** (math.floor(math.log2(torch.finfo(dtype).max)) // 2))


def _reached(before, after):
    """Where a gradient moved when one cotangent element grew large: the elements backward reads it into (and
    that were finite before)."""
    before, after = before.detach().to(torch.float64), after.detach().to(torch.float64)
    moved = (after - before).abs()
    moved = torch.where(moved.isfinite(), moved, torch.full_like(moved, math.inf))
    finite = moved[moved.isfinite()]
    largest = float(finite.max()) if finite.numel() else 0.0
    threshold = REACHED * largest if largest > 0 else math.inf
    return (moved > threshold) & before.isfinite()


def _reference_nonfinite(context, prepared, plain, cotangents):
    """Per leaf, where the reference's gradient along ``cotangents`` is not finite; None without a usable
    reference (none, it raises, or its outputs differ in number or shape from the op's)."""
    reference = context.case.reference
    if reference is None:
        return None
    try:
        outputs, grads = run_in(context, prepared, plain, cotangents=cotangents, fn=reference)
    except OpRaised:
        return None
    if len(outputs) != len(plain.outputs) or any(a.shape != b.shape for a, b in zip(outputs, plain.outputs)):
        return None
    return [~torch.isfinite(g) for g in grads]


def _fail(context, plain, chosen, value, name, grad, hidden, required, ref):
    from pytest_autograd.checks.mutation import backward_argument_names

    count = len(plain.outputs)
    grad_names = backward_argument_names(context.case, count)
    special, article = ("inf", "an") if math.isinf(value) else ("NaN", "a")
    where = ", ".join(f"{grad_names[j]}{fmt_index(unravel(f, tuple(plain.outputs[j].shape)))}"
                      for j, f in chosen.items())
    position = unravel(int(hidden.reshape(-1).nonzero()[0]), tuple(grad.shape))
    reference = " (the reference's gradient there is not finite)" if ref is not None else ""
    incoming = f"`{grad_names[next(iter(chosen))]}`" if len(chosen) == 1 else "the incoming gradients"
    fields = {"output": output_label(next(iter(chosen)), count)} if len(chosen) == 1 else {}
    kept = grad.detach()[hidden]  # the elements that stay finite, against what reaching them would give
    context.fail(
        f"{article} {special} in {incoming} does not reach the gradient w.r.t. `{name}`: {int(hidden.sum())} "
        f"of the {int(required.sum())} element(s) it flows into stay finite",
        argument=name, worst=f"grad {name}{fmt_index(position)}: {fmt(float(grad[position]))} with {where} = "
                             f"{special}{reference}",
        details=[f"{where} set to {special}, as a backward from a loss scaled past the dtype's range gives; "
                 "torch.amp.GradScaler skips the step only when it finds an inf or NaN in the gradients",
                 f"with a large finite value there instead, those elements of the gradient w.r.t. `{name}` move: "
                 "backward does read it into them"],
        hint=HINT.format(name=grad_names[next(iter(chosen))] if len(chosen) == 1 else "grad_output"),
        dtype=dtype_label(grad.dtype), evidence=[Evidence.of(f"grad {name} where it stays finite", torch.full_like(kept, value), kept)], **fields)


check = Overflow()
