"""Shared pieces of the transform and precision checks.

What a Function overrides (a ``jvp``, a ``vmap`` rule, ``setup_context``),
which low-precision dtypes to check on a device, casting a sample to a dtype
(so a float64 ground truth sees exactly the rounded inputs) and the
normwise error that the precision checks compare.
"""

import math
import re
from dataclasses import dataclass

import torch

from pytest_autograd.engine.case import is_autograd_function
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.engine.draws import normal
from pytest_autograd.engine.execution import OpRaised, grads_of, output_label
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import fmt, fmt_index, unravel

DTYPE_NAMES = {
    "float64": torch.float64, "double": torch.float64,
    "float32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
HALF_DTYPES = (torch.float16, torch.bfloat16)


def overrides(op, name):
    """True when the Function ``op`` defines its own ``name`` staticmethod."""
    if not is_autograd_function(op):
        return False
    from torch.autograd import Function

    return getattr(op, name, None) is not getattr(Function, name, None)


def check_dtypes(case, device):
    """(low-precision dtypes to check, explicit?) from ``dtypes=`` or the device's default.

    CPU: float32. Other devices: float32, float16, and bfloat16 where supported.
    Either way, a 16-bit dtype the samples themselves are in (a bfloat16
    training op) is checked too. ``dtypes=`` declares the dtypes the op
    supports: float64 among them is the ground truth, not a dtype to check here.
    """
    wanted = case.option("dtypes")
    if wanted is None:
        if device.split(":")[0] == "cpu":
            dtypes = [torch.float32]
        else:
            dtypes = [torch.float32, torch.float16]
            if device.split(":")[0] != "cuda" or _cuda_has_bf16():
                dtypes.append(torch.bfloat16)
        own = [d for d in HALF_DTYPES if d in samples_dtypes(case)]
        return list(dict.fromkeys(dtypes + own)), False
    wanted = [wanted] if isinstance(wanted, (str, torch.dtype)) else list(wanted)
    dtypes = []
    for entry in wanted:
        dtype = DTYPE_NAMES.get(entry) if isinstance(entry, str) else entry
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise UsageProblem(f"dtypes= names {entry!r}, not a floating dtype; use e.g. "
                               "dtypes=['float32', 'bfloat16'] or dtypes=[torch.float16].")
        dtypes.append(dtype)
    return [d for d in dict.fromkeys(dtypes) if d != torch.float64], True


def samples_dtypes(case):
    """The floating dtypes the samples' tensors are in, as given."""
    return {value.dtype for sample in case.samples for value in sample.values()
            if isinstance(value, torch.Tensor) and value.is_floating_point()}


def _cuda_has_bf16():
    try:
        return bool(torch.cuda.is_bf16_supported())
    except Exception:  # no CUDA in this build: the item is skipped before running anyway
        return False


def cast_sample(sample, dtype, magnitude=None, slots=None):
    """``sample`` with floating tensors cast to ``dtype``, optionally rescaled.

    ``magnitude``: each floating tensor in ``slots`` (default: all) is scaled
    so its largest |element| is that value (computed in float64, then rounded
    once to ``dtype``). The extreme check passes the differentiated slots
    only: constants (indices stored as floats, marginals, running
    statistics) keep their values.
    """

    def cast(slot, value):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return value
        value = value.detach()
        if magnitude is not None and (slots is None or slot in slots):
            low, high = (float(v) for v in torch.aminmax(value)) if value.numel() else (0.0, 0.0)
            peak = max(high, -low)  # exact in any dtype
            value = value.to(torch.float64, copy=True)  # one fresh tensor, scaled in place
            if peak > 0:
                value.mul_(magnitude / peak)
        return value.to(dtype)

    return sample.map(cast)


@dataclass
class Run:
    """Outputs and input gradients of one function on one prepared sample."""

    outputs: list
    grads: list
    names: list  # argument name per gradient


def forward_and_backward(context, sample, dtype, cotangents64=None, fn=None):
    """Run ``fn`` (default: the op) on ``sample`` cast to ``dtype``; vjp along ``cotangents64``.

    ``cotangents64`` (float64, one per output, None for non-floating ones) are
    cast to the run's output dtypes; when None, fresh random ones are drawn
    and returned rounded through the output dtype, so a float64 run can reuse
    exactly the same values.
    """
    try:
        return _forward_and_backward(context, sample, dtype, cotangents64, fn)
    except OpRaised as raised:
        if fn is None or isinstance(raised, ReferenceRaised):
            raise
        raise ReferenceRaised(raised.phase, raised.error) from raised.error


class ReferenceRaised(OpRaised):
    """``reference=`` raised, not the op: the report must not blame the op."""


def rounded_cotangents(outputs, generator, dtype=None):
    """Random cotangents for ``outputs`` (None for non-floating ones) in float64, with values that ``dtype`` (by
    default each output's own) holds exactly: a run in that dtype and one in float64 use the same numbers."""
    return [normal(tuple(out.shape), generator).to(dtype or out.dtype).to(torch.float64)
            if out.is_floating_point() else None for out in outputs]


def _forward_and_backward(context, sample, dtype, cotangents64, fn):
    prepared = context.prepare(sample, dtype=dtype)
    seed_generators(context.device, context.seed)  # an op drawing random numbers draws alike in every run it can
    outputs = context.run_op(prepared, fn=fn)
    if cotangents64 is None:
        cotangents64 = rounded_cotangents(outputs, context.generator)
    grads = []
    if prepared.leaves and any(o.requires_grad for o in outputs):
        cotangents = [None if c is None or not o.is_floating_point() else c.to(device=o.device, dtype=o.dtype)
                      for o, c in zip(outputs, cotangents64)]
        grads = [g.detach() for g in grads_of(outputs, prepared.leaves, cotangents)]
    return Run([o.detach() for o in outputs], grads, list(prepared.names)), cotangents64


@dataclass
class Pair:
    """One output or gradient of two runs: ``label`` names it in worst-element lines,
    ``what`` in summaries, ``fields`` in the report (output= or argument=)."""

    label: str
    what: str
    fields: dict
    expected: torch.Tensor
    got: torch.Tensor


def paired_tensors(truth, got):
    """A Pair for each floating output and each input gradient of two runs."""
    pairs = []
    count = len(truth.outputs)
    for k, (e, g) in enumerate(zip(truth.outputs, got.outputs)):
        if e.is_floating_point() and g.is_floating_point() and e.shape == g.shape:
            label = output_label(k, count)
            pairs.append(Pair(label, label, {"output": label}, e, g))
    for name, e, g in zip(truth.names, truth.grads, got.grads):
        pairs.append(Pair(f"grad {name}", f"gradient w.r.t. `{name}`", {"argument": name}, e, g))
    return pairs


@dataclass
class Error:
    """Normwise error: max |got - expected| / max |expected|, and where it peaks."""

    value: float
    index: tuple = ()
    expected: float = 0.0
    got: float = 0.0

    def worst(self, label):
        return f"{label}{fmt_index(self.index)}: float64 {fmt(self.expected)}, got {fmt(self.got)}"


def normwise_error(expected, got):
    expected = expected.detach().to("cpu", torch.float64)
    got = got.detach().to("cpu", torch.float64)
    if expected.numel() == 0:
        return Error(0.0, (), 0.0, 0.0)
    diff = (got - expected).abs()
    magnitude = expected.abs()
    scale, worst = float(magnitude.max()), float(diff.max())
    if math.isfinite(scale) and math.isfinite(worst):  # nothing special on either side: no masking to do
        flat = int(torch.argmax(diff))
        index = unravel(flat, expected.shape)
        value = worst / scale if scale > 0 else worst
        return Error(value, index, float(expected.reshape(-1)[flat]), float(got.reshape(-1)[flat]))
    finite = expected.isfinite()
    scale = float(magnitude[finite].max()) if bool(finite.any()) else 0.0
    same_special = (expected.isnan() & got.isnan()) | (expected.isinf() & (expected == got))
    diff = torch.where(same_special, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    flat = int(torch.argmax(diff))
    index = unravel(flat, expected.shape)
    worst = float(diff.reshape(-1)[flat])
    value = worst / scale if scale > 0 else worst
    return Error(value, index, float(expected.reshape(-1)[flat]), float(got.reshape(-1)[flat]))


_LOW_DTYPE_REFUSALS = (
    re.compile(r"not implemented for '(Half|BFloat16)'"),  # torch's dispatcher
    # triton.language.math (exp, log, sqrt, ... and tl.sigmoid through them) on a 16-bit block,
    # raised while the kernel compiles; the interpreter does not check, so only a GPU shows it
    re.compile(r"Expected dtype \[[^\]]*\] but got (fp16|bf16)"),
)


def unsupported_dtype(raised):
    """True when an op's exception (or one it was raised from) says the 16-bit dtype has no kernel here."""
    error, seen = raised.error, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = f"{error}\n{error!r}"
        if any(refusal.search(text) for refusal in _LOW_DTYPE_REFUSALS):
            return True
        error = error.__cause__ or error.__context__
    return False


# A message naming a dtype: how kernels (and torch's dispatch) say which dtypes they take.
_DTYPE_WORDS = re.compile(r"\b(dtypes?|float16|bfloat16|float32|float64|half|double|bf16|fp16|fp32|fp64|float|"
                          r"scalar type)\b", re.IGNORECASE)


def refuses_dtype(raised):
    """True when an op's exception (or one it was raised from) refuses a dtype: no kernel for it, or a message
    naming a dtype ("bfloat16 tensors only", "expected scalar type BFloat16", "unsupported dtype")."""
    if unsupported_dtype(raised):
        return True
    error, seen = raised.error, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (TypeError, ValueError, RuntimeError, NotImplementedError, AssertionError)) \
                and _DTYPE_WORDS.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


class DtypeRefusals:
    """The dtypes a check could not use because the op refuses them by design, and why.

    A refusal is an error naming a dtype, raised for a dtype that neither the
    samples are in nor ``dtypes=`` declares (the op is judged in those and
    must run there). The check then notes each refused dtype once, or, when
    the op refuses every dtype it could use, skips with one line.
    """

    def __init__(self, check, dtypes, explicit, case):
        self.check, self.dtypes, self.explicit = check, list(dtypes), explicit
        self.own = samples_dtypes(case)
        self.reasons = {}

    def refused(self, raised, dtype):
        """Record ``raised`` as ``dtype``'s refusal and return True when it is one; False: the op's failure."""
        if self.explicit or dtype in self.own:
            return False
        # The reference may lack a kernel for the dtype (torch's "not implemented for 'Half'"); the op may refuse it
        # by design, naming it.
        if not (unsupported_dtype(raised) if isinstance(raised, ReferenceRaised) else refuses_dtype(raised)):
            return False
        first = str(raised.error).strip().splitlines()[0] if str(raised.error).strip() else ""
        who = "the reference has no kernel for it" if isinstance(raised, ReferenceRaised) else "the op refuses it"
        self.reasons.setdefault(dtype, (who, f"{type(raised.error).__name__}: {first[:160]}"))
        return True

    def finish(self, context):
        """Skip when every dtype was refused; else one note per refused dtype."""
        from pytest_autograd.engine.outcomes import skip
        from pytest_autograd.results.compare import dtype_label

        if self.reasons and len(self.reasons) == len(self.dtypes):
            lines = [f"{dtype_label(d)} ({who}: {why})" for d, (who, why) in self.reasons.items()]
            skip(f"no dtype {self.check} could check on {context.device} runs: {'; '.join(lines)}; the samples' "
                 "own dtype is judged by the other checks")
        for dtype, (who, why) in self.reasons.items():
            context.note(f"{self.check}: not judged in {dtype_label(dtype)}: {who} ({why})")
