"""autocast: under ``torch.autocast`` the op runs forward and backward, and stays within the reference's error there.

A model under ``torch.autocast`` hands its ops float32 activations and
weights, and torch's own ops inside them compute in the autocast dtype
(bfloat16 on the CPU, float16 and bfloat16 on CUDA) or in float32 where that
dtype loses too much (losses, and on CUDA softmax, norms, reductions).
Backward runs outside the autocast region. A Function whose forward is not
``@torch.amp.custom_fwd`` saves a bfloat16 activation next to a float32
weight and its backward raises a dtype mismatch; one whose backward is not
``@torch.amp.custom_bwd`` recomputes in another dtype than its forward; an
op that runs a reduction in bfloat16 where torch's own op under autocast
runs it in float32 loses precision no plain check sees.

Per sample (float64 tensors as float32, as a model hands them) and autocast
dtype, the op runs forward under autocast and backward after it, along
cotangents every run holds exactly: it must run, every gradient must have
its input's dtype, and every output and gradient must be within the
precision checks' same-dtype budget of the truth (the reference in float64
on the same values): at most ``precision_k`` (3) times as far as the
reference under the same autocast, plus one ulp of the autocast dtype. The
op run plainly must be within that budget too, or its maths, not autocast,
differ from the reference's (gradcheck and reference judge those): then it
is not judged. Without ``reference=`` the truth is the op run plainly, and
only an error no rounding to the autocast dtype explains fails. A forward
that raises under autocast (an op that refuses the autocast dtype) is
noted.
"""

import math

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks._transforms import Run, normwise_error, paired_tensors, rounded_cotangents
from pytest_autograd.checks.base import Check, skip_if_the_interpreter_refused
from pytest_autograd.engine.execution import OpRaised, grads_of, has_floating_input
from pytest_autograd.results.compare import dtype_label, fmt

UNEXPLAINED = 0.1  # without a reference: a normwise error this large is beyond any rounding to 16 bits
FUNCTION_HINT = ("decorate forward with @torch.amp.custom_fwd(device_type='{device}') and backward with "
                 "@torch.amp.custom_bwd(device_type='{device}'): backward then runs under the autocast state forward "
                 "ran in, on tensors of the dtypes forward saved (or pass cast_inputs=torch.float32 to custom_fwd to "
                 "run the op in float32 under autocast)")
BACKWARD_HINT = ("forward is @torch.amp.custom_fwd but backward is not: decorate backward with "
                 "@torch.amp.custom_bwd(device_type='{device}') too, so it runs under the autocast state forward ran "
                 "in instead of without autocast, on a {dtype} grad_output and the float32 tensors forward saved")
OTHER_HINT = ("under autocast, torch ops inside the op compute in {dtype} while the op's own inputs stay float32: "
              "cast what backward combines to one dtype, or run the op in float32 under autocast "
              "(torch.autocast(..., enabled=False) around it, inputs cast to float32)")


class Autocast(Check):
    name = "autocast"
    description = ("under torch.autocast (bfloat16 on CPU, float16 and bfloat16 on CUDA) forward and backward run, "
                   "gradients keep their inputs' dtypes, outputs and gradients stay within the reference's error")
    random_draws_differ = "a run under autocast and a float64 one draw different numbers from one seed"
    # autocast_dtypes: the dtypes to run in (default: the device's, see autocast_dtypes); a model scan with
    # autocast= sets the one its step runs in
    options = {"precision_k": None, "autocast_dtypes": None}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument for autocast to cast"
        if not _dtypes(case, device):
            return f"torch.autocast has no dtype to run in on {device}"
        return None

    def run(self, context):
        for dtype in _dtypes(context.case, context.device):
            for index, sample in context.samples():
                _judge(context, as_handed(judged_sample(context, index, sample)), dtype)


def autocast_dtypes(device):
    """The autocast dtypes a training loop uses on ``device``: bfloat16 on the CPU, float16 (and bfloat16 where
    supported) on CUDA."""
    kind = str(device).split(":")[0]
    if kind == "cpu":
        return [torch.bfloat16]
    if kind == "cuda":
        try:
            bf16 = bool(torch.cuda.is_bf16_supported())
        except Exception:  # no CUDA in this build: the item is skipped before running anyway
            bf16 = False
        return [torch.float16] + ([torch.bfloat16] if bf16 else [])
    return []


def _dtypes(case, device):
    chosen = case.option("autocast_dtypes")
    return list(chosen) if chosen else autocast_dtypes(device)


def as_handed(sample):
    """``sample`` as a model under autocast hands it: float64 tensors as float32, every other one as it is."""
    return sample.map(lambda slot, value: value.to(torch.float32)
                      if isinstance(value, torch.Tensor) and value.dtype == torch.float64 else value)


class _Raised(Exception):
    """A run raised: ``who`` (the op or the reference), ``raised`` its OpRaised."""

    def __init__(self, who, raised):
        super().__init__(str(raised))
        self.who, self.raised = who, raised


def _run(context, sample, cotangents64, autocast=None, dtype=None, fn=None):
    """(Run, cotangents64) of the op (or ``fn``) on ``sample`` cast to ``dtype`` (None: as it is), forward under
    ``torch.autocast(autocast)`` when given, backward after it, along ``cotangents64`` (drawn when None: float64
    values the autocast dtype holds exactly)."""
    prepared = context.prepare(sample, dtype=dtype)
    call = fn or context.case.call
    if autocast is not None:
        kind = str(context.device).split(":")[0]

        def call_under_autocast(*args, **kwargs):
            with torch.autocast(kind, dtype=autocast):
                return call(*args, **kwargs)

        run_fn = call_under_autocast
    else:
        run_fn = call
    seed_generators(context.device, context.seed)  # an op drawing random numbers draws alike in every run it can
    who = "the reference" if fn is not None else "the op"
    try:
        outputs = context.run_op(prepared, fn=run_fn)
        if cotangents64 is None:
            cotangents64 = rounded_cotangents(outputs, context.generator, dtype=autocast)
        cotangents = [None if c is None or not o.is_floating_point() else c.to(device=o.device, dtype=o.dtype)
                      for o, c in zip(outputs, cotangents64)]
        grads = []
        if prepared.leaves and any(o.requires_grad for o in outputs):
            grads = [g.detach() for g in grads_of(outputs, prepared.leaves, cotangents)]
    except OpRaised as raised:
        raise _Raised(who, raised) from raised.error
    return Run([o.detach() for o in outputs], grads, list(prepared.names)), cotangents64, prepared


def _judge(context, sample, dtype):
    name = dtype_label(dtype)
    where = f"under torch.autocast({str(context.device).split(':')[0]!r}, dtype=torch.{name})"
    try:
        autocast_run, cotangents, prepared = _run(context, sample, None, autocast=dtype)
    except _Raised as error:
        return _op_raised(context, error.raised, where, dtype)
    _fail_on_gradient_dtypes(context, prepared, autocast_run, where)
    plain, _, _ = _run(context, sample, cotangents, dtype=_plain_dtype(sample))
    truth, reference_run = _reference_runs(context, sample, cotangents, dtype, where)
    if truth is None:
        _judge_against_plain(context, plain, autocast_run, where, dtype)
    else:
        _judge_against_reference(context, truth, reference_run, plain, autocast_run, where, dtype)


def _op_raised(context, raised, where, dtype):
    """The op raised under autocast: in backward (its forward ran) it fails; a forward that raises is a context
    the op cannot run in, noted (a kernel Triton's interpreter cannot run: the check is skipped, as every other)."""
    skip_if_the_interpreter_refused(raised)
    if raised.phase == "backward":
        device = str(context.device).split(":")[0]
        if not context.case.is_function:
            hint = OTHER_HINT.format(dtype=dtype_label(dtype))
        elif _decorated(context.case.op, "forward", "decorate_fwd") and \
                not _decorated(context.case.op, "backward", "decorate_bwd"):
            hint = BACKWARD_HINT.format(device=device, dtype=dtype_label(dtype))
        else:
            hint = FUNCTION_HINT.format(device=device)
        context.fail_raised(raised, f"{where}, after its forward ran there", hint=hint,
                            details=["backward runs after the autocast region, as in a training step, on the "
                                     "tensors forward saved under it"])
    error = raised.error
    context.note(f"autocast: not judged {where}: the op's forward raises there ({type(error).__name__}: "
                 f"{str(error).strip().splitlines()[0] if str(error).strip() else ''})")


def _decorated(function_class, method, wrapper):
    """Whether the Function's ``method`` is wrapped by torch.amp's ``custom_fwd``/``custom_bwd`` (``wrapper`` names
    the function they wrap it in)."""
    import inspect

    found = inspect.getattr_static(function_class, method, None)
    code = getattr(getattr(found, "__func__", found), "__code__", None)
    return code is not None and code.co_name == wrapper


def _plain_dtype(sample):
    """The dtype of the op's plain run: float32 for a sample of mixed floating dtypes (bfloat16 activations next to
    float32 weights, as a model scan records them under autocast, which only autocast lets meet), else as it is."""
    dtypes = {value.dtype for value in sample.values() if isinstance(value, torch.Tensor) and value.is_floating_point()}
    return torch.float32 if len(dtypes) > 1 else None


def _fail_on_gradient_dtypes(context, prepared, run, where):
    for leaf, name, grad in zip(prepared.leaves, prepared.names, run.grads):
        if grad.dtype != leaf.dtype:
            context.fail(f"the gradient w.r.t. `{name}` {where} is {dtype_label(grad.dtype)}, not its input's "
                         f"{dtype_label(leaf.dtype)}", argument=name,
                         hint="an optimizer updates a float32 weight with its gradient: return each gradient in its "
                              "input's dtype (`grad.to(weight.dtype)`)")


def _reference_runs(context, sample, cotangents, dtype, where):
    """(the reference in float64, the reference under autocast), or (None, None) without a usable reference."""
    reference = context.case.reference
    if reference is None:
        return None, None
    try:
        truth, _, _ = _run(context, sample, cotangents, dtype=torch.float64, fn=reference)
        under, _, _ = _run(context, sample, cotangents, autocast=dtype, fn=reference)
    except _Raised as error:
        context.note(f"autocast: reference={getattr(reference, '__name__', 'the reference')} raises "
                     f"{'in float64' if 'float64' in str(error) else where} ({type(error.raised.error).__name__}); "
                     "the op is judged against its own float32 run instead")
        return None, None
    return truth, under


def _judge_against_reference(context, truth, reference_run, plain, autocast_run, where, dtype):
    from pytest_autograd.checks.precision import Budget

    budget = Budget.of(context.case, dtype)
    reference_pairs = {p.label: p for p in paired_tensors(truth, reference_run)}
    plain_pairs = {p.label: p for p in paired_tensors(truth, plain)}
    worst = None
    for pair in paired_tensors(truth, autocast_run):
        if pair.label not in reference_pairs or pair.label not in plain_pairs:
            continue
        error = normwise_error(pair.expected, pair.got)
        ref_error = normwise_error(pair.expected, reference_pairs[pair.label].got).value
        allowed = budget.k * ref_error + budget.floor
        if not error.value > allowed:
            continue
        plain_error = normwise_error(pair.expected, plain_pairs[pair.label].got).value
        if plain_error > allowed:
            context.note(f"autocast: {pair.what} not judged {where}: the op run plainly is already off from the "
                         f"reference by {fmt(plain_error)}, beyond the autocast budget; gradcheck and reference judge "
                         "its maths")
            continue
        if worst is None or error.value / max(allowed, 1e-300) > worst[1].value / max(worst[2], 1e-300):
            worst = (pair, error, allowed, ref_error)
    if worst is not None:
        pair, error, allowed, ref_error = worst
        name = dtype_label(dtype)
        context.fail(
            f"{pair.what} {where} is further from float64 than the reference's under the same autocast",
            dtype=name, worst=error.worst(pair.label),
            error=(f"normwise error {fmt(error.value)} > budget {fmt(allowed)} ({fmt(budget.k)} x the reference's "
                   f"own error {fmt(ref_error)} under autocast, plus one {name} ulp)"),
            details=["the op run plainly in float32 is within that budget: autocast, not its maths, makes the "
                     "difference", "forward ran under autocast, backward after it; truth: the reference in float64 "
                                   "on the same values"],
            hint=_precision_hint(context, dtype, error), **pair.fields)


def _judge_against_plain(context, plain, autocast_run, where, dtype):
    for pair in paired_tensors(plain, autocast_run):
        error = normwise_error(pair.expected, pair.got)
        if error.value > UNEXPLAINED or not math.isfinite(error.value):
            context.fail(
                f"{pair.what} {where} is far from the op's own float32 run", dtype=dtype_label(dtype),
                worst=error.worst(pair.label).replace("float64", "float32 run"),
                error=f"normwise error {fmt(error.value)} > {fmt(UNEXPLAINED)}, beyond what rounding to "
                      f"{dtype_label(dtype)} explains",
                details=["without reference= the truth is the op run plainly; give reference= to judge it "
                         "against the reference under the same autocast"],
                hint=_precision_hint(context, dtype, error), **pair.fields)


def _precision_hint(context, dtype, error):
    name = dtype_label(dtype)
    if not math.isfinite(error.got):
        return (f"a value overflows (or turns NaN) in {name} under autocast where float32 holds it: compute that "
                "part in float32 (torch.autocast(..., enabled=False) around it, or custom_fwd(cast_inputs="
                "torch.float32))")
    return (f"under autocast, torch ops inside the op compute in {name}; torch's own ops for reductions, norms, "
            "softmax and losses run in float32 there: run the op's reductions in float32 (`x.float()` before them, "
            "or @torch.amp.custom_fwd(cast_inputs=torch.float32) on forward), and round to the activation dtype once "
            "at the end")


check = Autocast()
