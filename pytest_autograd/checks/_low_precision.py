"""Derivative checks for ops that cannot run in float64.

Most CUDA and Triton kernels accept only float32 (or 16-bit) inputs, raise
on float64, or compute in float32 whatever they get. Finite differences with
float64 constants then measure rounding, not the derivative. Such ops are
still judged, in the most precise dtype they accept, by one of two
strategies, and the strategy is named in the pass note or the failure:

* with ``reference=``: the op's gradients in its dtype against the
  reference's gradients in float64 on exactly the same rounded inputs and
  cotangents, within the precision check's budget (``precision_k`` times
  the reference's own error in that dtype, plus a few ulps);
* without one: central differences in the op's dtype at three step sizes.
  The perturbed inputs are rounded to the dtype, and the analytical side
  uses exactly the rounded step, so input rounding costs nothing. A wrong
  gradient is an error that does not change with the step; truncation and
  rounding errors do, so the spread across steps (plus the rounding of the
  outputs that moved) is the tolerance.
"""

import math
from dataclasses import dataclass

import torch

from pytest_autograd.checks._derivatives import DerivativeError
from pytest_autograd.compare import dtype_label, fmt, fmt_index
from pytest_autograd.execution import OpRaised, grads_of, random_cotangents

LOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # most precise first
STEP_FACTORS = (2.0, 1.0, 0.5)  # of the base step eps ** (1/3) * max|x|
ELEMENT_PROBES = 6  # per argument, besides two random directions
NOISE_ULPS = 4  # rounding allowance on the outputs that moved and on the analytical side
SPREAD_FACTOR = 3.0  # how many times the measured spread across steps is tolerated
RELATIVE_FLOOR_ULPS = 4  # relative allowance on the projected derivative, in eps ** (2/3)
LEAF_FLOOR_ULPS = 4  # allowance on an element probe relative to the argument's largest gradient, in eps ** (2/3)

STRATEGY_REFERENCE = "gradients in {dtype} against the reference's float64 gradients on the same rounded inputs"
STRATEGY_DIFFERENCES = ("central differences in {dtype} at three step sizes, tolerance from the measured spread "
                        "between them")


@dataclass
class Plan:
    """Why float64 cannot judge this op, and the dtype that will."""

    dtype: torch.dtype
    reason: str

    def strategy(self, has_reference):
        template = STRATEGY_REFERENCE if has_reference else STRATEGY_DIFFERENCES
        return template.format(dtype=dtype_label(self.dtype))

    def note(self, check, has_reference):
        return (f"{check}: {self.reason}; judged by {self.strategy(has_reference)}")


def declared_dtypes(case):
    """The dtypes ``dtypes=`` declares, most precise first; None when the marker declares none."""
    if case.option("dtypes") is None:
        return None
    from pytest_autograd.checks._transforms import check_dtypes

    low, _ = check_dtypes(case, "cpu")
    wanted = case.option("dtypes")
    wanted = [wanted] if isinstance(wanted, (str, torch.dtype)) else list(wanted)
    has_float64 = any(entry in (torch.float64, "float64", "double") for entry in wanted)
    return sorted(low + [torch.float64] * has_float64, key=lambda d: torch.finfo(d).eps)


def float64_plan(context, sample):
    """None when the op computes in float64 on ``sample``; else the Plan for judging it in a lower dtype.

    Detected from ``dtypes=`` without float64, from an op (forward or
    backward) that raises on float64 but runs in a lower dtype, or from
    outputs below float64 for float64 inputs. An op that raises in every
    dtype is left to the float64 path, which reports its error.
    """
    cache = context.case.__dict__.setdefault("_float64_plans", {})
    key = (id(sample), context.device)
    if key not in cache:
        cache[key] = _float64_plan(context, sample)
    return cache[key]


def sample_dtype(context, sample):
    """The sample's own dtype, or the plan's when the sample is float64 and the op cannot run in it."""
    from pytest_autograd.execution import floating_dtype

    dtype = floating_dtype(sample)
    if dtype == torch.float64:
        plan = float64_plan(context, sample)
        if plan is not None:
            return plan.dtype
    return dtype


def _float64_plan(context, sample):
    declared = declared_dtypes(context.case)
    if declared is not None and torch.float64 not in declared:
        listed = ", ".join(dtype_label(d) for d in declared)
        return Plan(declared[0], f"dtypes=({listed}) on the marker declares no float64")
    prepared = context.prepare(sample, dtype=torch.float64)
    try:
        outputs = context.run_op(prepared)
        lower = sorted({o.dtype for o in outputs if o.is_floating_point() and o.dtype != torch.float64},
                       key=lambda d: torch.finfo(d).eps)
        if lower:
            return Plan(lower[0], f"the op returns {'/'.join(dtype_label(d) for d in lower)} outputs for float64 "
                                  "inputs")
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, context.generator))
    except OpRaised as raised:
        if declared is not None:
            return None
        for dtype in LOW_DTYPES:
            if _runs_in(context, sample, dtype):
                first = str(raised.error).strip().splitlines()[0] if str(raised.error).strip() else ""
                return Plan(dtype, f"the op's {raised.phase} raises on float64 ({type(raised.error).__name__}: "
                                   f"{first[:120]})")
        return None
    finally:
        context.dtype = None
    return None


def _runs_in(context, sample, dtype):
    prepared = context.prepare(sample, dtype=dtype)
    try:
        outputs = context.run_op(prepared)
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads_of(outputs, prepared.leaves, random_cotangents(outputs, context.generator))
    except OpRaised:
        return False
    return True


def cast_leaves(leaves, dtype):
    return [leaf.detach().to(dtype).requires_grad_(True) for leaf in leaves]


# ---------------------------------------------------------------------------
# With a reference: gradients against the reference's float64 gradients
# ---------------------------------------------------------------------------

@dataclass
class Disagreement:
    """One gradient over the error budget, in the reference strategy."""

    label: str
    argument: str
    error: object  # the op's normwise Error against the float64 truth
    ref_error: float  # the reference's own error in the low dtype (None when it cannot run there)
    budget: float

    def worst(self):
        e = self.error
        return f"{self.label}{fmt_index(e.index)}: expected {fmt(e.expected)} (reference, float64), got {fmt(e.got)}"

    def error_line(self):
        if self.ref_error is None:
            return f"normwise error {fmt(self.error.value)} > tolerance {fmt(self.budget)}"
        return (f"normwise error {fmt(self.error.value)} > budget {fmt(self.budget)} (precision_k x the reference's "
                f"own error {fmt(self.ref_error)} in this dtype, plus {8} ulps)")


def against_reference(op_low, ref_truth, ref_low, dtype, k):
    """The worst op gradient (one Run each side) beyond the precision budget, or None."""
    from pytest_autograd.checks._transforms import normwise_error
    from pytest_autograd.checks.precision import floor

    worst = None
    ref_grads = dict(zip(ref_truth.names, ref_truth.grads))
    ref_low_grads = dict(zip(ref_low.names, ref_low.grads)) if ref_low is not None else {}
    for name, got in zip(op_low.names, op_low.grads):
        truth = ref_grads.get(name)
        if truth is None:
            continue
        error = normwise_error(truth, got)
        ref_error = normwise_error(truth, ref_low_grads[name]).value if name in ref_low_grads else None
        budget = (k * ref_error if ref_error is not None else 0.0) + floor(dtype)
        if ref_error is None:
            budget = max(budget, 16 * floor(dtype))
        if error.value > budget and (worst is None or error.value / budget > worst.error.value / worst.budget):
            worst = Disagreement(f"grad {name}", name, error, ref_error, budget)
    return worst


# ---------------------------------------------------------------------------
# Without a reference: measured central differences in the op's dtype
# ---------------------------------------------------------------------------

def find_low_precision_error(fn, leaves, names, generator, dtype, needs_grad=False, kinks=None):
    """Worst DerivativeError of ``fn(leaves) -> outputs`` (leaves in ``dtype``), or None.

    ``kinks``, a list, receives the probes where one-sided differences differ
    and the analytical value is one of them or between them: a kink (relu,
    clamp, max with ties), noted rather than failed.
    """
    outputs = fn(leaves)
    diff = [k for k, out in enumerate(outputs) if out.is_floating_point() and out.requires_grad]
    if not diff or not leaves:
        return None
    outputs = [outputs[k] for k in diff]
    cotangents = random_cotangents(outputs, generator)
    analytical = [g.detach().to(torch.float64) for g in grads_of(outputs, leaves, cotangents, retain_graph=True)]
    negated = grads_of(outputs, leaves, [-c for c in cotangents], retain_graph=True)
    eps = torch.finfo(dtype).eps
    worst = _sign_error(analytical, negated, names, eps)
    cotangents64 = [c.detach().to(torch.float64) for c in cotangents]

    def evaluate(moved):
        with torch.set_grad_enabled(needs_grad):
            if needs_grad:
                moved = [m.detach().requires_grad_(True) for m in moved]
            outs = fn(moved)
        return [outs[k].detach().to(torch.float64) for k in diff]

    center = evaluate([leaf.detach() for leaf in leaves])
    for j, leaf in enumerate(leaves):
        x = leaf.detach().to(torch.float64)
        peak = float(x.abs().max()) if x.numel() else 0.0
        base = eps ** (1 / 3) * (peak if peak > 0 else 1.0)
        leaf_scale = float(analytical[j].abs().max()) if analytical[j].numel() else 0.0
        for label, direction in _directions(leaf, generator):
            found = _judge_direction(evaluate, leaves, j, x, direction, base, dtype, cotangents64,
                                     analytical[j], names[j], label, eps, leaf_scale, center)
            if isinstance(found, str):
                if kinks is not None:
                    kinks.append(found)
                continue
            worst = _pick(worst, found)
    return worst


def _judge_direction(evaluate, leaves, j, x, direction, base, dtype, cotangents64, grad, name, label, eps,
                     leaf_scale, center):
    """None when the probe agrees, the probe's label (a str) at a kink, else a DerivativeError."""
    errors, predicted_values, floors, one_sided = [], [], [], []
    for factor in STEP_FACTORS:
        step = base * factor
        plus, minus = (x + step * direction).to(dtype), (x - step * direction).to(dtype)
        delta = plus.to(torch.float64) - minus.to(torch.float64)
        if not bool((delta != 0).any()):
            continue
        moved_plus = [leaf.detach() for leaf in leaves]
        moved_minus = list(moved_plus)
        moved_plus[j], moved_minus[j] = plus, minus
        out_plus, out_minus = evaluate(moved_plus), evaluate(moved_minus)
        change = sum(float(((p - m) * v).sum()) for p, m, v in zip(out_plus, out_minus, cotangents64))
        moved = sum(float(((p.abs() + m.abs()) * v.abs() * (p != m)).sum())
                    for p, m, v in zip(out_plus, out_minus, cotangents64))
        predicted = float((grad * delta).sum())
        width = 2 * step
        errors.append((change - predicted) / width)
        right = sum(float(((p - c) * v).sum()) for p, c, v in zip(out_plus, center, cotangents64))
        left = sum(float(((c - m) * v).sum()) for c, m, v in zip(center, out_minus, cotangents64))
        one_sided.append(((right - float((grad * (plus.to(torch.float64) - x)).sum())) / step,
                          (left - float((grad * (x - minus.to(torch.float64))).sum())) / step))
        predicted_values.append(predicted / width)
        floors.append(NOISE_ULPS * eps * (moved + float((grad.abs() * delta.abs()).sum())) / width)
    if len(errors) < 2 or not all(math.isfinite(e) for e in errors):
        if errors and not all(math.isfinite(e) for e in errors):
            return DerivativeError("all outputs", name, f"grad {name}{label}", math.nan, math.nan, math.inf, 0.0,
                                   "central differences in " + dtype_label(dtype), False, True)
        return None
    spread = max(errors) - min(errors)
    # The best relative accuracy of central differences is about eps ** (2/3): allowed on this direction's
    # derivative, and (a few times) on the argument's largest gradient, where quantised outputs move.
    scale = max(abs(p) for p in predicted_values)
    reach = leaf_scale * float(direction.abs().sum()) if label.startswith("[") and "random" not in label else 0.0
    tolerance = (SPREAD_FACTOR * spread + max(floors)
                 + eps ** (2 / 3) * (RELATIVE_FLOOR_ULPS * scale + LEAF_FLOOR_ULPS * reach))
    best = min(range(len(errors)), key=lambda i: abs(errors[i]))
    if abs(errors[best]) <= tolerance:
        return None
    if _at_kink(one_sided, tolerance, one_element="random" not in label):
        return f"grad {name}{label}"
    got = predicted_values[best]
    expected = got + errors[best]
    return DerivativeError(
        output="all outputs", argument=name, element=f"grad {name}{label}", expected=expected, got=got,
        abs_error=abs(errors[best]), tolerance=tolerance,
        strategy=(f"central differences in {dtype_label(dtype)} at steps {', '.join(fmt(base * f) for f in STEP_FACTORS)}; "
                  f"the error stays at {', '.join(fmt(e) for e in errors)} whatever the step, so it is the "
                  "gradient's, not rounding's"),
        argument_grad_all_zero=bool((grad == 0).all()), numerical_nonzero=expected != 0.0,
    )


def _at_kink(one_sided, tolerance, one_element=True):
    """One-sided differences that differ by a jump that does not shrink with the step, with the analytical
    value equal to one of them or between them: a kink, where central differences average two slopes.

    A random direction may cross several kinks at once, where each element's subgradient sits between its
    own slopes but their sum need not sit between the direction's two one-sided slopes: there a kink is
    enough, and the element probes judge the elements one by one.
    """
    right, left = one_sided[-1]  # the smallest step
    jump, first_jump = right - left, one_sided[0][0] - one_sided[0][1]
    if abs(jump) <= tolerance or abs(jump) < 0.5 * abs(first_jump):
        return False  # the sides agree, or they differ only by curvature, which shrinks with the step
    return not one_element or right * left <= 0 or min(abs(right), abs(left)) <= tolerance


def _sign_error(analytical, negated, names, eps):
    """backward(-v) must be -backward(v), up to rounding."""
    worst = None
    for name, g, n in zip(names, analytical, negated):
        n = n.detach().to(torch.float64)
        error = (g + n).abs()
        tolerance = NOISE_ULPS * eps * (float(g.abs().max()) if g.numel() else 0.0) + 1e-30
        if g.numel() and float(error.max()) > tolerance:
            flat = int(torch.argmax(error))
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))
            found = DerivativeError(
                "all outputs", name, f"grad {name}{fmt_index(index)} for -grad_output", float(-g[index]),
                float(n[index]), float(error[index]), tolerance,
                "negated random cotangent; the gradient for -grad_output must be minus the gradient for "
                "grad_output, so backward is not linear in grad_output (e.g. right only for positive grad_outputs)",
                False, True)
            worst = _pick(worst, found)
    return worst


def _directions(leaf, generator):
    """Element probes (every element of a small argument, else corners and random ones) and two random directions."""
    shape = tuple(leaf.shape)
    numel = leaf.numel()
    if numel == 0:
        return []
    if numel <= ELEMENT_PROBES:
        flats = list(range(numel))
    else:
        chosen = torch.randperm(numel - 2, generator=generator)[: ELEMENT_PROBES - 2] + 1
        flats = [0, numel - 1] + sorted(int(i) for i in chosen)
    probes = []
    for flat in flats:
        direction = torch.zeros(numel, dtype=torch.float64)
        direction[flat] = 1.0
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape)) if shape else ()
        probes.append((fmt_index(index), direction.view(shape).to(leaf.device)))
    for _ in range(2):
        direction = torch.randn(shape, generator=generator, dtype=torch.float64)
        probes.append(("[...] . random direction", direction.to(leaf.device)))
    return probes


def _pick(current, candidate):
    if candidate is None:
        return current
    if current is None:
        return candidate
    ratio = lambda d: d.abs_error / max(d.tolerance, 1e-300)  # noqa: E731
    return candidate if ratio(candidate) > ratio(current) else current


# ---------------------------------------------------------------------------
# The checks' entry points
# ---------------------------------------------------------------------------

def judge_first_derivatives(context, sample, plan):
    """gradcheck for an op that cannot run in float64: fails through ``context``, notes on pass."""
    from pytest_autograd.checks._hints import derivative_hint
    from pytest_autograd.checks._surrogate import SURROGATE_HINT, looks_like_surrogate
    from pytest_autograd.notes import note

    case, dtype = context.case, plan.dtype
    details = [f"strategy: {plan.note('gradcheck', case.reference is not None)}"]
    if case.reference is not None:
        op_low, ref_truth, ref_low = _reference_runs(context, sample, dtype)
        worst = against_reference(op_low, ref_truth, ref_low, dtype, _precision_k(case))
        if worst is not None:
            context.fail(f"gradient w.r.t. `{worst.argument}` in {dtype_label(dtype)} does not match the reference's "
                         "float64 gradient", dtype=dtype_label(dtype), argument=worst.argument, worst=worst.worst(),
                         error=worst.error_line(), details=details,
                         hint="the op's backward is wrong for this argument (the reference, run on the same rounded "
                              "inputs in float64, disagrees by more than rounding explains)")
    else:
        prepared = context.prepare(sample, dtype=dtype)
        if prepared.leaves:
            kinks = []
            error = find_low_precision_error(lambda leaves: context.run_op(prepared, leaves), prepared.leaves,
                                             prepared.names, context.generator, dtype, kinks=kinks)
            _note_kinks("gradcheck", kinks)
            if error is not None:
                context.fail(f"gradient of {error.output} w.r.t. `{error.argument}` does not match the numerical "
                             f"derivative in {dtype_label(dtype)}", dtype=dtype_label(dtype), output=error.output,
                             argument=error.argument, worst=error.worst(), error=error.error_line(), details=details,
                             hint=(SURROGATE_HINT.format(name=error.argument) if looks_like_surrogate(error)
                                   else derivative_hint(error, has_backward=case.is_function)))
    context.dtype = None
    note(plan.note("gradcheck", case.reference is not None))


def judge_second_derivatives(context, sample, plan, backward_of):
    """gradgradcheck for an op that cannot run in float64.

    ``backward_of(prepared, differentiable, cotangent_count)`` returns the
    function ``leaves -> first gradients`` that gradgradcheck differentiates.
    """
    from pytest_autograd.notes import note

    case, dtype = context.case, plan.dtype
    details = [f"strategy: {plan.note('gradgradcheck', case.reference is not None)}"]
    if case.reference is not None:
        worst = _second_order_against_reference(context, sample, dtype)
        if worst is not None:
            context.fail(f"second derivative w.r.t. `{worst.argument}` in {dtype_label(dtype)} does not match the "
                         "reference's float64 one", dtype=dtype_label(dtype), argument=worst.argument,
                         worst=worst.worst(), error=worst.error_line(), details=details,
                         hint="the backward's own gradient is wrong (or not differentiable): check the ops backward "
                              "uses on saved tensors")
    else:
        prepared = context.prepare(sample, dtype=dtype)
        outputs = context.run_op(prepared) if prepared.leaves else []
        differentiable = [k for k, o in enumerate(outputs) if o.is_floating_point() and o.requires_grad]
        if differentiable:
            fn, leaves, names = backward_of(prepared, outputs, differentiable)
            kinks = []
            error = find_low_precision_error(fn, leaves, names, context.generator, dtype, needs_grad=True,
                                             kinks=kinks)
            _note_kinks("gradgradcheck", kinks)
            if error is not None:
                context.fail(f"second derivative of {error.output} w.r.t. `{error.argument}` does not match the "
                             f"numerical one in {dtype_label(dtype)}", dtype=dtype_label(dtype), output=error.output,
                             argument=error.argument, worst=error.worst(), error=error.error_line(), details=details,
                             hint="the backward's own gradient is wrong (or not differentiable): check the ops "
                                  "backward uses on saved tensors")
    context.dtype = None
    note(plan.note("gradgradcheck", case.reference is not None))


def _note_kinks(check, kinks):
    if kinks:
        from pytest_autograd.notes import note

        note(f"{check}: at {', '.join(kinks[:3])}{' and more' if len(kinks) > 3 else ''} the one-sided differences "
             "differ (a kink) and the analytical value is one of them or between them: noted, not failed")


def _precision_k(case):
    from pytest_autograd.checks.precision import _number

    return _number(case.option("precision_k", 2.0), "precision_k")


def _reference_runs(context, sample, dtype):
    """(op in dtype, reference in float64, reference in dtype or None) on the same rounded inputs and cotangents."""
    from pytest_autograd.checks._transforms import ReferenceRaised, cast_sample, forward_and_backward

    low = cast_sample(sample, dtype)
    op_low, cotangents = forward_and_backward(context, low, dtype)
    try:
        ref_truth, _ = forward_and_backward(context, low, torch.float64, cotangents, fn=context.case.reference)
    except ReferenceRaised as raised:
        context.fail_reference_raised(raised)
    try:
        ref_low, _ = forward_and_backward(context, low, dtype, cotangents, fn=context.case.reference)
    except ReferenceRaised:
        ref_low = None
    return op_low, ref_truth, ref_low


def _second_order_against_reference(context, sample, dtype):
    """Second-order vjps of the op in ``dtype`` vs the reference's in float64, on the same rounded values."""
    from pytest_autograd.checks._transforms import ReferenceRaised, Run, cast_sample

    low = cast_sample(sample, dtype)
    draws = {}

    def run(run_dtype, fn):
        prepared = context.prepare(low, dtype=run_dtype)
        outputs = context.run_op(prepared, fn=fn)
        diff = [k for k, o in enumerate(outputs) if o.is_floating_point() and o.requires_grad]
        if "v" not in draws:
            draws["v"] = [torch.randn(outputs[k].shape, generator=context.generator, dtype=torch.float64)
                          .to(dtype).to(torch.float64) for k in diff]
        cotangents = [v.to(device=outputs[k].device, dtype=outputs[k].dtype).requires_grad_(True)
                      for k, v in zip(diff, draws["v"])]
        try:
            firsts = torch.autograd.grad([outputs[k] for k in diff], prepared.leaves, cotangents,
                                         create_graph=True, allow_unused=True)
        except Exception as error:
            raise OpRaised("backward", error) from error
        firsts = [torch.zeros_like(x) if g is None else g for x, g in zip(prepared.leaves, firsts)]
        if "w" not in draws:
            draws["w"] = [torch.randn(g.shape, generator=context.generator, dtype=torch.float64)
                          .to(dtype).to(torch.float64) for g in firsts]
        pairs = [(g, w.to(device=g.device, dtype=g.dtype)) for g, w in zip(firsts, draws["w"]) if g.requires_grad]
        wrt = list(prepared.leaves) + cotangents
        if pairs:
            try:
                seconds = torch.autograd.grad([g for g, _ in pairs], wrt, [w for _, w in pairs], allow_unused=True)
            except Exception as error:
                raise OpRaised("backward", error) from error
        else:
            seconds = [None] * len(wrt)
        seconds = [torch.zeros_like(x) if s is None else s.detach() for x, s in zip(wrt, seconds)]
        names = list(prepared.names) + [f"grad_output{'' if len(diff) == 1 else ' ' + str(k)}" for k in diff]
        return Run([], seconds, names)

    op_low = run(dtype, None)
    try:
        ref_truth = run(torch.float64, context.case.reference)
    except OpRaised as raised:
        context.fail_reference_raised(ReferenceRaised(raised.phase, raised.error))
    try:
        ref_low = run(dtype, context.case.reference)
    except OpRaised:
        ref_low = None
    return against_reference(op_low, ref_truth, ref_low, dtype, _precision_k(context.case))
