"""grad_metadata: backward returns gradients with the dtype, device and shape of their inputs.

The autograd engine quietly repairs what backward returns: it casts a
float32 gradient to the float64 input's dtype (a bfloat16 one to a float32
master weight's) and sums a broadcast gradient down to the input's shape.
The cast hides a real loss of precision, so this check records what every
Python backward on the way returned, before the engine touches it
(``_raw_backward``): the op's Functions, those inside a module, a
torch.library op's registered backward. It runs each sample in float64 and
in its own dtypes, mixed ones kept as they are (bfloat16 activations with
float32 weights), where mixed-precision bugs live. ``grad_casts=`` names
the arguments whose gradient may come back in another dtype on purpose.

A backward that computes in float32 and casts back before returning leaves
no trace in the metadata, but it leaves one in the values: every element
of a float64 gradient is then exactly a float32 number, which genuine
float64 arithmetic on a random float64 cotangent practically never gives.
That fingerprint is checked for every op (on the engine's gradients when
the op is not an autograd.Function).
"""

import warnings

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._float64_support import float64_plan
from pytest_autograd.checks._hygiene import HygieneWarning, call_with
from pytest_autograd.checks._raw_backward import has_python_backward, recording
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    constants_only_reason,
    grads_of,
    has_floating_input,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import dtype_label

FINGERPRINT_MIN_ELEMENTS = 4  # non-zero gradient elements needed before the float32 fingerprint counts
FINGERPRINT_HEAD = 4096  # elements looked at first: a value off the float32 grid there settles it
OFF_GRID = 1.0 + 2.0 ** -30  # float64 cotangents times this hold values no float32 number has

PRECISION_HINT = ("compute the gradient in the input's dtype: drop .float() / .to(torch.float32) and float32 "
                  "buffers or kernels from backward (cast only where a lower precision is really intended)")
CAST_HINT = ("compute the gradient in the input's dtype and return it in that dtype: no .float() or .half()/.bfloat16() "
             "and no buffers or kernels of another dtype on the way out (float32 master weights of bfloat16 "
             "activations get float32 gradients: grad.float().T @ x.float()); where another dtype is meant, declare "
             "it on the marker: grad_casts=(\"{name}\",)")


class GradMetadata(Check):
    name = "grad_metadata"
    description = "raw gradients from backward have their input's dtype, device and shape (no float32 in float64)"
    # dtypes: the dtypes the op supports; without float64 it is judged in the best one.
    # grad_casts: arguments whose gradient backward may return in another dtype (names, or True for all).
    options = {"dtypes": None, "grad_casts": None}

    def applies(self, case, device):
        if not has_floating_input(case):
            return "no floating-point tensor argument to differentiate"
        return constants_only_reason(case)

    def run(self, context):
        warned = set()
        allowed = _allowed_casts(context.case)
        for index, sample in context.samples():
            sample = judged_sample(context, index, sample)
            for dtype in _run_dtypes(context, sample):
                prepared = context.prepare(sample, dtype=dtype)
                if not prepared.leaves:
                    continue
                args, kwargs = prepared.call_args()
                outputs = call_with(context.case, args, kwargs).outputs
                if prepared.leaves[0].dtype != torch.float64 and not has_python_backward(outputs):
                    continue  # no raw gradient to read, and the float32 fingerprint needs float64
                grads = self._backward(context, prepared, outputs, warned, allowed)
                who = "backward returns" if context.case.is_function else "the op's backward gives"
                for name, leaf, grad in zip(prepared.names, prepared.leaves, grads):
                    _check_fingerprint(context, name, leaf, grad, who)
            context.dtype = None

    def _backward(self, context, prepared, outputs, warned, allowed):
        """The engine's gradients; first, every raw gradient a Python backward returned on the way is judged."""
        cotangents = _off_float32_grid(random_cotangents(outputs, context.generator, repeating=True))
        raised = None
        with recording() as raw:
            try:
                grads = grads_of(outputs, prepared.leaves, cotangents)
            except OpRaised as error:  # an unrepairable gradient makes the engine raise: the raw one says why
                raised, grads = error, None
        for record in raw:
            name = next((name for name, leaf in zip(prepared.names, prepared.leaves) if leaf is record.leaf), None)
            _check_metadata(context, record, name, warned, allowed)
        if raised is not None:
            raise raised
        return grads


def _off_float32_grid(cotangents):
    """The float64 cotangents with a bit float32 does not have in every non-zero element.

    Large cotangents are drawn in float32 and widened (``engine/draws``): a
    backward that only copies, masks or scales grad_output by a power of two
    (a permutation, a ReLU, ``x * 0.5``) would return float32 numbers from
    genuine float64 arithmetic, the float32 fingerprint. One factor of
    ``OFF_GRID`` sets a bit 30 places below each element's leading one, 7
    below float32's last.
    """
    return [c * OFF_GRID if c is not None and c.dtype == torch.float64 else c for c in cotangents]


def _run_dtypes(context, sample):
    """float64 (unless the op cannot run in it), then the sample's own dtypes, mixed ones kept as they are.

    A sample whose float64 tensors the op cannot take runs in the plan's dtype
    instead: float32 gradients are then what the op promises.
    """
    plan = float64_plan(context, sample)
    own = {value.dtype for value in sample.values()
           if isinstance(value, torch.Tensor) and value.is_floating_point()}
    if plan is not None:
        return [plan.dtype] if own <= {torch.float64} else [None]
    return [torch.float64] + ([] if own <= {torch.float64} else [None])


def _allowed_casts(case):
    """The argument names whose gradient may come back in another dtype (``grad_casts=``); True: all."""
    value = case.option("grad_casts")
    if value is None or value is False:
        return frozenset()
    if value is True:
        return True
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple, set)) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise UsageProblem(f"grad_casts= takes argument names (e.g. grad_casts=(\"weight\",)) or True, got {value!r}.")
    return frozenset(names)


def _check_metadata(context, record, name, warned, allowed):
    grad, what = record.grad, f"`{name}`" if name else f"input {record.position} of {record.function}"
    details = [f"raw gradient: {_describe(grad.dtype, grad.shape, grad.device)}, returned by "
               f"{record.function}'s backward; input: {_describe(record.dtype, record.shape, record.device)}"]
    fields = {"argument": name} if name else {}
    expected, got = record.dtype, grad.dtype
    if got != expected and not (allowed is True or name in allowed):
        loss = ""
        if expected.is_floating_point and got.is_floating_point and torch.finfo(got).eps > torch.finfo(expected).eps:
            loss = f": the {dtype_label(expected)} gradient then carries only {dtype_label(got)} precision"
        context.fail(f"backward returns the gradient of {what} as {dtype_label(got)}, but {what} is "
                     f"{dtype_label(expected)}; autograd casts it silently{loss}", details=details,
                     hint=CAST_HINT.format(name=name or "name"), **fields)
    if grad.device != record.device:
        context.fail(f"backward returns the gradient of {what} on {grad.device}, but {what} is on {record.device}",
                     details=details, hint="create gradients on the input's device (e.g. torch.zeros_like(input), "
                                           "or device=input.device)", **fields)
    if tuple(grad.shape) != record.shape:
        if _expandable(record.shape, grad.shape):
            key = (record.function, record.position)
            if key in warned:
                return
            warned.add(key)
            warnings.warn(HygieneWarning(
                f"{context.case.name}: backward returns the gradient of {what} with shape {list(grad.shape)} "
                f"for an input of shape {list(record.shape)}; autograd sums it over the broadcast dimensions. "
                "Legal, but reducing it in backward saves memory and states the intent."), stacklevel=3)
        else:
            context.fail(f"backward returns the gradient of {what} with shape {list(grad.shape)}, "
                         f"which cannot be summed to the input's shape {list(record.shape)}", details=details,
                         hint="return a gradient of exactly the input's shape", **fields)


def _check_fingerprint(context, name, leaf, grad, who):
    if leaf.dtype != torch.float64 or grad.dtype != torch.float64:
        return
    values = grad.detach().reshape(-1)
    if _off_float32(values[:FINGERPRINT_HEAD]):
        return  # one value no float32 number has, among the first few: the whole gradient is not all float32
    values = values[(values != 0) & values.isfinite()]
    if values.numel() < FINGERPRINT_MIN_ELEMENTS:
        return
    if not _off_float32(values):
        context.fail(f"{who} a float64 gradient for `{name}` whose {values.numel()} non-zero values are all "
                     "exactly float32 numbers: backward computes in float32 and casts back", argument=name,
                     details=[("float64 arithmetic on a random float64 grad_output practically never lands on "
                              "float32 values; float32 arithmetic always does")], hint=PRECISION_HINT)


def _off_float32(values):
    """Whether some finite value of ``values`` (float64) is no float32 number."""
    return bool((values.to(torch.float32).to(torch.float64) != values)[values.isfinite()].any())


def _expandable(input_shape, grad_shape):
    try:
        return tuple(torch.broadcast_shapes(tuple(input_shape), tuple(grad_shape))) == tuple(grad_shape)
    except RuntimeError:
        return False


def _describe(dtype, shape, device):
    return f"{dtype_label(dtype)}{list(shape)} on {device}"


check = GradMetadata()
