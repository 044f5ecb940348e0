"""Running an op the way a careful hand-written test would.

Owns everything people get wrong by hand: fresh leaves with requires_grad
for floating inputs, casting and moving to a device, passing clones so an
in-place op never touches a leaf, and flattening outputs.
"""

from dataclasses import dataclass

import torch

from pytest_autograd.engine.complex_views import (
    as_complex,
    real_dtype,
    real_output,
    real_view_leaf,
)
from pytest_autograd.engine.draws import normal_like, repeating_normal_like
from pytest_autograd.engine.outcomes import OpRaised, UsageProblem, raised_by_op  # OpRaised: re-exported
from pytest_autograd.results.report import CheckFailure, Report


def is_differentiable_dtype(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point()


def floating_tensors(sample):
    """The sample's differentiable tensor arguments, positional then keyword: floating, and complex ones
    (each differentiated as a pair of reals, see complex_views)."""
    return [value for value in sample.values()
            if is_differentiable_dtype(value) or (isinstance(value, torch.Tensor) and value.is_complex())]


def floating_dtype(sample):
    """The real dtype the sample's first differentiable tensor is checked in (None without one)."""
    found = floating_tensors(sample)
    return real_dtype(found[0].dtype) if found else None


def has_floating_input(case):
    return any(floating_tensors(sample) for sample in case.samples)


def constants_only_reason(case):
    """Why no derivative can be checked when ``constants=`` names every differentiable argument; else None."""
    for sample in case.samples:
        differentiable = {id(value) for value in floating_tensors(sample)}
        slots = list(enumerate(sample.args)) + list(sample.kwargs.items())
        if any(slot not in case.constant_slots for slot, value in slots if id(value) in differentiable):
            return None
    return "every floating-point argument is a constants= argument: there is no derivative to check"


def differentiable_indices(outputs):
    """Positions of the outputs that carry a gradient: floating and attached to the graph."""
    return [k for k, out in enumerate(outputs) if out.is_floating_point() and out.requires_grad]


def declared_nondifferentiable(case, outputs):
    """Positions of the floating outputs an autograd.Function declares non-differentiable
    (``ctx.mark_non_differentiable``): they do not require grad although its inputs do.

    Any other op's floating output that does not require grad is not declared
    but detached (``.detach()``, numpy, ``torch.no_grad``): the op's bug,
    which the derivative checks report.
    """
    if not case.is_function:
        return ()
    return tuple(k for k, out in enumerate(outputs) if out.is_floating_point() and not out.requires_grad)


@dataclass
class Prepared:
    """A sample made ready for one run: leaves plus the fixed arguments around them."""

    args: list
    kwargs: dict
    slots: list  # where each leaf sits: int (positional) or str (keyword)
    leaves: list  # the differentiable inputs, leaf tensors
    names: list  # argument name of each leaf
    complex_slots: frozenset = frozenset()  # leaves that are real views of complex arguments


    def call_args(self, leaves=None, clone_leaves=True, copy_mutable=True):
        """Arguments for one call, with ``leaves`` (default: own) in their slots: cloned, unless the caller made
        them for this call alone (``clone_leaves=False``). Other tensors are always cloned; mutable non-tensor
        arguments (lists, dicts) are copied unless ``copy_mutable=False`` (timed loops)."""
        leaves = self.leaves if leaves is None else leaves
        args, kwargs = list(self.args), dict(self.kwargs)
        for slot, leaf in zip(self.slots, leaves):
            value = leaf.clone() if clone_leaves else leaf
            if slot in self.complex_slots:
                value = as_complex(value)
            if isinstance(slot, int):
                args[slot] = value
            else:
                kwargs[slot] = value
        for position, value in enumerate(args):
            if isinstance(value, torch.Tensor) and position not in self.slots:
                args[position] = value.clone()
            elif copy_mutable and position not in self.slots:
                args[position] = _fresh(value)
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor) and key not in self.slots:
                kwargs[key] = value.clone()
            elif copy_mutable and key not in self.slots:
                kwargs[key] = _fresh(value)
        return args, kwargs


def _fresh(value):
    """A copy of a mutable non-tensor argument (list, dict, set), so no call sees another call's changes to it."""
    if isinstance(value, (list, dict, set, bytearray)):
        import copy

        try:
            return copy.deepcopy(value)
        except Exception:  # e.g. holds something that cannot be copied: pass it as it is
            return value
    return value


def prepare(case, sample, device, dtype=None, requires_grad=True, only=None):
    """Copy ``sample`` onto ``device``; floating tensors become leaves.

    ``dtype`` casts floating tensors (e.g. float64 for numerical checks).
    ``only``, a set of slots, limits which floating inputs require grad.
    """
    args, kwargs, slots, leaves, names = [], {}, [], [], []
    complex_slots = set()

    def convert(slot, value):
        if not isinstance(value, torch.Tensor):
            return value
        value = value.detach()
        if value.is_complex() and requires_grad and (only is None or slot in only) \
                and slot not in case.constant_slots:
            value = real_view_leaf(value, device, dtype).requires_grad_(True)
            complex_slots.add(slot)
            slots.append(slot)
            leaves.append(value)
            names.append(case.arg_name(slot))
            return value
        if value.is_floating_point():
            value = value.to(device=device, dtype=dtype or value.dtype, copy=True)
            if requires_grad and (only is None or slot in only) and slot not in case.constant_slots:
                value.requires_grad_(True)
                slots.append(slot)
                leaves.append(value)
                names.append(case.arg_name(slot))
            return value
        return value.to(device=device, copy=True)

    def convert_or_explain(slot, value):
        try:
            return convert(slot, value)
        except (RuntimeError, NotImplementedError, TypeError) as error:
                raise UsageProblem(
                f"argument `{case.arg_name(slot)}` ({value.device.type} tensor, {value.dtype}) cannot be copied to "
                f"{device}{' as ' + str(dtype) if dtype else ''}: {error}. Build samples from real data on the CPU; "
                "the plugin moves them to each device."
            ) from None

    for position, value in enumerate(sample.args):
        args.append(convert_or_explain(position, value))
    for key, value in sample.kwargs.items():
        kwargs[key] = convert_or_explain(key, value)
    return Prepared(args, kwargs, slots, leaves, names, frozenset(complex_slots))


def flatten_outputs(result):
    """The op's tensor outputs, in order, from a tensor or (nested) tuple/list/dict."""
    if isinstance(result, torch.Tensor):
        return [_checkable(result)]
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, (tuple, list)):
        flat = []
        for item in result:
            flat.extend(flatten_outputs(item))
        return flat
    return []


def _checkable(output):
    """A sparse output as dense, a complex one as its real view: what every check compares and differentiates."""
    if output.layout != torch.strided and not output.is_nested:
        output = output.to_dense()
    return real_output(output)


def output_label(index, count):
    return "output" if count == 1 else f"output {index}"


def run_op(case, prepared, leaves=None, fn=None, clone_leaves=True):
    """Call the op (or ``fn``) on fresh clones of the leaves (on ``leaves`` themselves when the caller made them
    for this call alone: ``clone_leaves=False``); return flat outputs."""
    args, kwargs = prepared.call_args(leaves, clone_leaves=clone_leaves)
    try:
        result = (fn or case.call)(*args, **kwargs)
    except Exception as error:  # reported as the op's own failure
        raise raised_by_op("forward", error) from error
    outputs = flatten_outputs(result)
    if not outputs:
        raise UsageProblem(
            f"the {'function' if fn else 'op'} returned {type(result).__name__} ({result!r:.60}), which holds no "
            "tensor: there is nothing to check. Return the op's output tensors (a tensor, or a tuple/list/dict of them)."
        )
    return outputs


def as_dense(grad):
    """A sparse gradient as a strided one (None stays None). A backward may return a sparse gradient for a dense
    input, as a sparse embedding's does, and autograd hands it on as it is; the checks compare, sum and index
    gradients element by element. ``to_dense`` is differentiable, so a second derivative still flows."""
    if grad is None or grad.layout == torch.strided or grad.is_nested:
        return grad
    return grad.to_dense()


def grads_of(outputs, leaves, cotangents, create_graph=False, retain_graph=None):
    """vjp: gradients of ``sum(<cotangent, output>)`` w.r.t. leaves, zeros for unused."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if c is not None and o.requires_grad]
    if not pairs:
        return [torch.zeros_like(leaf) for leaf in leaves]
    from pytest_autograd.engine.backward_only import autograd_grad

    try:
        grads = autograd_grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True,
                              create_graph=create_graph, retain_graph=retain_graph)
    except Exception as error:
        raise raised_by_op("backward", error) from error
    return [torch.zeros_like(leaf) if g is None else as_dense(g) for leaf, g in zip(leaves, grads)]


def random_cotangents(outputs, generator, device=None, repeating=False):
    """Sign-mixed, non-unit cotangents for differentiable outputs (None for others). ``repeating``: large ones
    may repeat a random block (``draws.repeating_normal_like``): for checks that compare runs, not derivatives."""
    draw = repeating_normal_like if repeating else normal_like
    cotangents = []
    for output in outputs:
        if is_differentiable_dtype(output):
            cotangents.append(draw(tuple(output.shape), generator, device or output.device, output.dtype))
        else:
            cotangents.append(None)
    return cotangents


def op_failure(check, error, context, sample=None, dtype=None):
    """A CheckFailure for an op that raised, pointing at the user's frame."""
    where = error.where()
    details = [f"at {where}"] if where else []
    return CheckFailure(
        Report(
            check=check,
            summary=f"the op's {error.phase} raised {type(error.error).__name__}: {error.error}",
            device=context.device,
            dtype=dtype,
            sample=sample,
            details=details,
            hint=_constant_hint(str(error.error)),
        )
    )


_REQUIRES_GRAD_REFUSALS = ("cannot have requires_grad", "is not differentiable with respect to argument",
                           "does not require grad and does not have a grad_fn")


def _constant_hint(message):
    """Known torch messages, translated into what to change in the op or the marker."""
    if any(refusal in message for refusal in _REQUIRES_GRAD_REFUSALS):
        return ("every floating tensor argument is differentiated by default; declare the ones that are "
                "constants on the marker, e.g. constants=('running_mean', 'running_var')")
    if "incorrect number of gradients" in message:
        return ("backward must return exactly one value per argument of forward (after ctx), in order: "
                "a gradient for each tensor input, None for non-tensor or non-differentiable ones")
    if "returned an invalid gradient" in message:
        return "each gradient backward returns must have the shape (and dtype) of its input"
    if "active drivers" in message or "cannot be accessed from Triton" in message:
        return ("a Triton kernel got CPU tensors: without a GPU, run it in Triton's interpreter by setting "
                "TRITON_INTERPRET=1 before triton is imported (e.g. `TRITON_INTERPRET=1 pytest`)")
    return None
