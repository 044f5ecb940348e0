"""noncontiguous: the same values in another memory layout give the same outputs and gradients.

The classic kernel bug indexes ``data_ptr()`` as if the tensor were
contiguous: right for every freshly made test tensor, wrong (or out of
bounds) for a transposed weight, a sliced batch, an expanded bias or a
channels-last image. Each layout is applied to the arguments and to the
incoming gradient, and compared with the contiguous run of the same values;
on a mismatch the culprit argument is found by laying out one at a time.

The layouts are those autograd hands a backward in real models, and the
same for inputs:

* ``transposed``: dims reversed (``x.T``, ``permute``); the last stride is not 1;
* ``sliced``: every other element of a wider buffer (a strided slice);
* ``row-strided``: last stride 1, rows further apart than their width, what
  a backward gets when its output was concatenated, split, chunked or
  narrowed along the last dim downstream (``torch.cat([y, z], -1)``); a
  kernel that checks only the innermost stride reads the wrong rows;
* ``offset``: contiguous at a nonzero storage offset (a chunk or split along
  dim 0);
* ``permuted``: the leading dims' memory order swapped, the last dim still
  innermost (a batch/sequence transpose), 3+ dims;
* ``broadcast``: the incoming gradient only, every stride 0, one value
  everywhere: what the backward of ``.sum()`` or ``.mean()`` gives;
* ``expanded``: stride 0 along the leading dim (the values become equal
  along it, so the contiguous run uses those values too; only for floating
  arguments of 2+ dims the op does not modify in place);
* ``channels-last`` (4-D and 5-D).

The layouts that keep the values share one contiguous run per sample.
On a sample of over 16k elements the layouts are judged on its first rows,
each row whole, where the op takes the same path there (``_fewer_rows``).
"""

from dataclasses import dataclass

import torch

from pytest_autograd.checks._agreement import agree
from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import call_with, tensor_arguments, written_while
from pytest_autograd.checks._reruns import seed_generators
from pytest_autograd.checks.base import Check
from pytest_autograd.checks.mutation import declared_by_marker
from pytest_autograd.engine.complex_views import as_complex
from pytest_autograd.engine.device_faults import raise_if_fault
from pytest_autograd.engine.exploration import OWN_VALUES_IN_A_LAYOUT, Variant, exploring, rehearse
from pytest_autograd.engine.execution import (
    OpRaised,
    differentiable_indices,
    grads_of,
    output_label,
    prepare,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.results.compare import compare_tensors

HINT = ("the kernel reads memory as if the tensor were contiguous: call .contiguous() on inputs (and on "
        "grad_output in backward) before handing them to a kernel, or index with the tensor's strides")


def _split_dim(tensor):
    """The last dim of size > 1, or None."""
    for dim in reversed(range(tensor.dim())):
        if tensor.shape[dim] > 1:
            return dim
    return None


def _big_dims(tensor):
    return sum(1 for size in tensor.shape if size > 1)


def _laid_out(tensor, storage_elements, offset, strides):
    """``tensor``'s values in a fresh storage of ``storage_elements``, at ``offset`` with ``strides``, zeros in the
    elements between them: one allocation, and not a view of another tensor.

    The layouts are about strides; being a view is another matter, with rules of
    its own in autograd (a Function that modifies a view in place may return
    only one output), which a correct op that never sees views may break.
    """
    fills = torch.empty if storage_elements == tensor.numel() else torch.zeros  # no element between the values
    base = fills(storage_elements, dtype=tensor.dtype, device=tensor.device)
    laid = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    laid.set_(base.untyped_storage(), offset, tensor.shape, strides)
    return laid.copy_(tensor)


def _in_order(tensor, order):
    """``tensor`` laid out with its dims in memory in ``order`` (outermost first), as ``_laid_out`` makes it (a
    fresh tensor, not a view, whose gradient flows back to ``tensor``). Copying element by element into
    transposed strides takes four times as long on a 1024 x 1024 tensor as torch's own permuted ``contiguous()``,
    blocked for the cache, which lays the values out in that order first: the last copy then runs straight
    through memory."""
    packed = tensor.permute(order).contiguous()
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return _laid_out(packed.permute(inverse), tensor.numel(), 0, _strides(tensor.shape, order))


def _strides(shape, order):
    """Contiguous strides for ``shape`` with its dims laid out in memory in ``order`` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for dim in reversed(order):
        strides[dim] = step
        step *= max(shape[dim], 1)
    return strides


def transposed(tensor):
    if _big_dims(tensor) < 2:
        return None
    return _in_order(tensor, list(reversed(range(tensor.dim()))))


def sliced(tensor):
    dim = _split_dim(tensor)
    if dim is None:
        return None
    wide = list(tensor.shape)
    wide[dim] *= 2  # every other element along ``dim`` of a buffer twice as wide there
    strides = _strides(wide, range(tensor.dim()))
    strides[dim] *= 2
    return _laid_out(tensor, tensor.numel() * 2, 0, strides)


def row_strided(tensor):
    """Rows of a buffer twice as wide: last stride 1, the row stride larger than the row."""
    if tensor.dim() < 2 or tensor.numel() <= tensor.shape[-1] or tensor.shape[-1] == 0:
        return None
    wide = list(tensor.shape)
    wide[-1] *= 2
    return _laid_out(tensor, tensor.numel() * 2, 0, _strides(wide, range(tensor.dim())))


OFFSET = 2  # elements before the first one in its storage: even, so a complex tensor's real view stays complex


def offset(tensor):
    """Contiguous, at a nonzero storage offset."""
    if tensor.numel() == 0:
        return None
    return _laid_out(tensor, OFFSET + tensor.numel(), OFFSET, _strides(tensor.shape, range(tensor.dim())))


def permuted(tensor):
    """The first two dims of size > 1 swapped in memory (not the last one, which stays innermost)."""
    big = [dim for dim in range(tensor.dim() - 1) if tensor.shape[dim] > 1]
    if len(big) < 2 or tensor.shape[-1] < 1:
        return None
    order = list(range(tensor.dim()))
    order[big[0]], order[big[1]] = order[big[1]], order[big[0]]
    return _in_order(tensor, order)


def channels_last(tensor):
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if tensor.dim() not in formats or _big_dims(tensor) < 2:
        return None
    laid = tensor.contiguous(memory_format=formats[tensor.dim()])
    return None if laid.is_contiguous() else laid


def expanded_source(tensor):
    """(a copy of the leading row, the full shape): expanding one to the other gives stride 0; None if impossible."""
    if tensor.dim() < 2 or tensor.shape[0] < 2 or tensor.numel() < 2:
        return None
    return tensor.detach()[:1].clone(), tensor.shape


def _broadcast_cotangent(tensor):
    """One value everywhere, every stride 0: the incoming gradient of an output that is summed or averaged."""
    if tensor.numel() < 2:
        return None
    return tensor.reshape(-1)[:1].expand(tensor.shape)


@dataclass
class Layout:
    name: str
    make: object  # tensor -> same-valued tensor in this layout, or None when impossible
    description: str
    keeps_values: bool = True  # False: the layout changes values (a stride 0 repeats one), its own contiguous run
    cotangent_only: bool = False  # lays out grad_output only: the inputs' contiguous run (and graph) is shared


LAYOUTS = [
    Layout("transposed", transposed, "transposed (dims reversed, not contiguous)"),
    Layout("sliced", sliced, "sliced (every other element of a wider buffer)"),
    Layout("at a storage offset", offset, f"at storage offset {OFFSET} (contiguous otherwise, as a chunk along "
                                          "dim 0 is)"),
    Layout("row-strided", row_strided, "row-strided (last stride 1, rows twice their width apart, as after "
                                       "torch.cat, split, chunk or narrow along the last dim)"),
    Layout("permuted", permuted, "permuted (two leading dims swapped in memory, the last dim still innermost)"),
    Layout("broadcast", None, "broadcast (every stride 0, one value everywhere, as the backward of .sum() or "
                              ".mean() gives)", keeps_values=False, cotangent_only=True),
    Layout("expanded", None, "expanded (stride 0 along the leading dim)", keeps_values=False),
    Layout("channels_last", channels_last, "channels-last"),
]


class NonContiguous(Check):
    name = "noncontiguous"
    explores = True  # builds inputs the user did not give: judged by engine.exploration, run in the sandbox
    description = "transposed, sliced, expanded and channels-last inputs and grad_outputs give the same results"
    random_draws_differ = "torch.rand_like of a transposed input draws in its memory order"

    def applies(self, case, device):
        for sample in case.samples:
            for value in sample.values():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    return None
        return "every tensor argument has at most one element: no layout can make it non-contiguous"

    def run(self, context):
        ran = False
        for index, sample in context.samples():
            sample = judged_sample(context, index, sample)
            prepared = context.prepare(sample)
            baseline = _Baseline(context, prepared)
            for layout in LAYOUTS:
                plan = _plan(context, prepared, layout, baseline.written)
                with exploring(context, _variant(plan, layout, list(plan.laid), bool(plan.cotangent), narrows=True),
                               narrow=lambda: _narrowed(context, plan, layout, baseline)):  # noqa: B023
                    if _check_plan(context, plan, layout, sample, baseline):
                        ran = True
        if not ran:
            skip("no argument or output of any sample can be laid out non-contiguously")


@dataclass
class Plan:
    """One layout applied to one sample: the tensors gradients are taken w.r.t., and both sides' arguments."""

    prepared: object
    sources: list  # leaves; gradients are compared w.r.t. them
    source_names: list
    source_slots: list
    laid: dict  # slot -> (name, build contiguous copy, build laid-out tensor), same values
    cotangent: object  # cotangent -> laid-out cotangent, or None


def _variant(plan, layout, slots, cotangent, narrows=False):
    """The layout of ``slots`` (and of grad_output, with ``cotangent``) as an input the op must accept: the user's
    own values, laid out as autograd lays tensors out."""
    who = [f"`{plan.laid[slot][0]}`" for slot in slots] + (["grad_output"] if cotangent else [])
    situation = f"when {' and '.join(who) or 'nothing'} {'is' if len(who) == 1 else 'are'} {layout.name}"
    return Variant(NonContiguous.name, situation, evidence=(OWN_VALUES_IN_A_LAYOUT,), hint=HINT, narrows=narrows,
                   cotangent_layout=plan.cotangent if cotangent else None)


def _narrowed(context, plan, layout, baseline):
    """After a crash with every argument and grad_output laid out: each argument laid out alone, then grad_output
    alone, so that the failure names the one the op cannot read (a crash fails there, naming it)."""
    parts = [([slot], False) for slot in plan.laid] + ([([], True)] if plan.cotangent else [])
    if len(parts) < 2:
        return
    for slots, cotangent in parts:
        with exploring(context, _variant(plan, layout, slots, cotangent)):
            try:
                _run(context, plan, set(slots), baseline.cotangents, laid_cotangent=cotangent)
            except OpRaised:
                pass


def _call_order(prepared):
    """The argument slots, positional then keyword."""
    return list(range(len(prepared.args))) + list(prepared.kwargs)


def _plan(context, prepared, layout, written):
    args, kwargs = prepared.args, prepared.kwargs
    sources, source_names, source_slots, laid = [], [], [], {}
    for slot in _call_order(prepared):
        value = args[slot] if isinstance(slot, int) else kwargs[slot]
        if not isinstance(value, torch.Tensor):
            continue
        name = context.case.arg_name(slot)
        differentiable = slot in prepared.slots
        found = None
        if layout.name == "expanded" and differentiable and slot not in written:
            found = expanded_source(value)
        if found is not None:
            small, shape = found
            value = small.requires_grad_(True)
            laid[slot] = (name, lambda s=small, shape=shape: s.expand(shape).contiguous(),
                          lambda s=small, shape=shape: s.clone().expand(shape))
        elif layout.make is not None and layout.make(value.detach()) is not None:
            laid[slot] = (name, lambda v=value: v.clone(), lambda v=value, make=layout.make: make(v))
        if differentiable:
            sources.append(value)
            source_names.append(name)
            source_slots.append(slot)
    cotangent = {"expanded": _expanded_cotangent, "broadcast": _broadcast_cotangent}.get(layout.name, layout.make)
    return Plan(prepared, sources, source_names, source_slots, laid, cotangent)


def _expanded_cotangent(tensor):
    dim = next((d for d in range(tensor.dim()) if tensor.shape[d] > 1), None)
    if dim is None:
        return None
    index = [slice(None)] * dim + [slice(0, 1)]
    return tensor[tuple(index)].expand(tensor.shape)


def _arguments(plan, laid_slots):
    """Arguments for one call: laid-out tensors in ``laid_slots``, contiguous copies elsewhere."""
    prepared = plan.prepared
    args, kwargs = list(prepared.args), dict(prepared.kwargs)
    for slot in list(range(len(args))) + list(kwargs):
        value = args[slot] if isinstance(slot, int) else kwargs[slot]
        if not isinstance(value, torch.Tensor):
            continue
        if slot in plan.laid:
            _, plain, laid = plan.laid[slot]
            value = laid() if slot in laid_slots else plain()
        else:
            value = value.clone()
        if slot in prepared.complex_slots:  # a complex argument's real view: the layout is the view's
            value = as_complex(value)
        if isinstance(slot, int):
            args[slot] = value
        else:
            kwargs[slot] = value
    return args, kwargs


def _forward(context, plan, laid_slots, passed=None):
    """The op's outputs on the plan's arguments; ``passed`` (a dict), when given, gets the tensor given in each
    argument slot. Every call starts from one seed: an op drawing random numbers draws the same ones in each
    layout that does not change their order."""
    args, kwargs = _arguments(plan, laid_slots)
    if passed is not None:
        passed.update({slot: value for slot, value in list(enumerate(args)) + list(kwargs.items())})
    seed_generators(context.device, context.seed)
    return call_with(context.case, args, kwargs).outputs


def _run(context, plan, laid_slots, cotangents, laid_cotangent=False, outputs=None):
    """Outputs and source gradients of one call; each call gets fresh copies of the cotangents.

    ``outputs``: the call's outputs when the caller has just made it (with their graph).
    """
    outputs = _forward(context, plan, laid_slots) if outputs is None else outputs
    if not plan.sources:
        return outputs, []
    try:
        return outputs, grads_of(outputs, plan.sources, _fresh(plan, cotangents, laid_cotangent))
    except OpRaised as raised:
        if not _sparse_through_layout(raised):
            raise
    # A sparse gradient (a sparse embedding's) cannot flow back through the copy that laid the argument out: the
    # call is made again and differentiated w.r.t. the tensors the op was given, which get the same gradient.
    passed = {}
    outputs = _forward(context, plan, laid_slots, passed)
    return outputs, grads_of(outputs, [passed[slot] for slot in plan.source_slots],
                             _fresh(plan, cotangents, laid_cotangent))


def _fresh(plan, cotangents, laid_cotangent):
    """Copies of ``cotangents`` for one backward (laid out as the plan says when ``laid_cotangent``)."""
    fresh = []
    for cotangent in cotangents:
        if cotangent is not None:
            cotangent = cotangent.clone()
            if laid_cotangent and plan.cotangent(cotangent) is not None:
                cotangent = plan.cotangent(cotangent)
        fresh.append(cotangent)
    return fresh


def _sparse_through_layout(raised):
    return isinstance(raised.error, RuntimeError) and "converting to a different layout" in str(raised.error)


def _plain_cotangents(plan, outputs, generator):
    """Contiguous cotangents holding the values their laid-out versions will have; and whether any can be laid out."""
    plain, any_laid = [], False
    for cotangent in random_cotangents(outputs, generator, repeating=True):
        laid_out = None if cotangent is None else plan.cotangent(cotangent)
        any_laid = any_laid or laid_out is not None
        plain.append(cotangent if laid_out is None else laid_out.contiguous())
    return plain, any_laid


class _Baseline:
    """The contiguous run of one sample: forward and backward on fresh copies of its arguments, one random
    cotangent per output and the gradients along it, the graph kept for the layouts of grad_output alone. The
    value-keeping layouts compare with it; it also shows which arguments the op writes in place (forward's
    version counters and values, the marker's ``mutates=``, and what backward changes: a memory-saving backward
    writing the gradients into its saved inputs), which the expanded layout must leave alone."""

    def __init__(self, context, prepared):
        args, kwargs = prepared.call_args()
        arguments = tensor_arguments(context.case, args, kwargs)
        versions = [tensor._version for _, _, tensor in arguments]
        seed_generators(context.device, context.seed)
        self.outputs = call_with(context.case, args, kwargs).outputs
        declared = declared_by_marker(context.case)  # mutates=: written by forward, or by a memory-saving backward
        self.written = {slot for (slot, name, tensor), version in zip(arguments, versions)
                        if tensor._version != version or slot in declared or name in declared}
        self.cotangents = random_cotangents(self.outputs, context.generator, repeating=True)
        sources = [prepared.args[slot] if isinstance(slot, int) else prepared.kwargs[slot]
                   for slot in _call_order(prepared) if slot in prepared.slots]
        fresh = [None if c is None else c.clone() for c in self.cotangents]

        def backward():
            return grads_of(self.outputs, sources, fresh, retain_graph=True) if sources else []

        if sources and differentiable_indices(self.outputs):
            written, grads = written_while(arguments, backward)
            self.written |= {slot for slot, _ in written}
        else:
            grads = backward()
        self.expected = (self.outputs, grads)

    def agrees(self, context, plan):
        """For a layout of grad_output alone: True when its gradients equal the contiguous ones on the kept
        graph; None when it lays out nothing; False when that cannot tell (the full comparison decides)."""
        cotangents, laid = _plain_cotangents(plan, self.outputs, context.generator)
        if not laid:
            return None
        if not plan.sources:
            return False
        try:
            want = grads_of(self.outputs, plan.sources, [None if c is None else c.clone() for c in cotangents],
                            retain_graph=True)
            got = grads_of(self.outputs, plan.sources,
                           [None if c is None else plan.cotangent(c.clone()) for c in cotangents], retain_graph=True)
        except OpRaised:
            return False
        return all(_compare(context, a, b) is None for a, b in zip(want, got))


def _check_plan(context, plan, layout, sample, baseline):
    """Compare the contiguous run with the laid-out one; blame one argument on a mismatch.

    The value-keeping layouts compare with ``baseline``, computed once per
    sample; a layout of grad_output alone first compares on its kept graph.
    """
    if layout.keeps_values:
        expected, cotangents = baseline.expected, baseline.cotangents
        cotangent_laid = any(c is not None and plan.cotangent(c) is not None for c in cotangents)
        if not plan.laid and not cotangent_laid:
            return False
    else:
        if layout.cotangent_only:
            rehearse(context, *plan.prepared.call_args())  # its backward, along the laid-out gradient, elsewhere first
            agrees = baseline.agrees(context, plan)
            if agrees is not False:
                return bool(agrees)
        try:
            outputs = _forward(context, plan, set())
        except OpRaised:
            return False  # the equal values along the expanded dims are outside the op's domain
        cotangents, cotangent_laid = _plain_cotangents(plan, outputs, context.generator)
        if not plan.laid and not cotangent_laid:
            return False
        expected = _run(context, plan, set(), cotangents, outputs=outputs)
    problem = _difference(context, plan, expected, set(plan.laid), cotangents, True)
    if problem is None:
        return True
    if not layout.keeps_values and _only_rounding(context, layout, sample, problem):
        equal = {"expanded": "the values along the leading dim"}.get(layout.name, "every element of grad_output")
        context.note(f"noncontiguous: the {layout.name} layout makes {equal} equal, where the op "
                     "is ill-conditioned: its layouts differ in the sample's dtype but agree in float64, so the "
                     "difference is rounding, not a layout bug")
        return True
    culprits = [f"`{name}`" for slot, (name, _, _) in plan.laid.items()
                if _difference(context, plan, expected, {slot}, cotangents) is not None]
    if cotangent_laid and _difference(context, plan, expected, set(), cotangents, True) is not None:
        culprits.append("grad_output")
    _report(context, layout, problem, culprits or _everything(plan, cotangent_laid), not culprits)


def _only_rounding(context, layout, sample, problem):
    """True when a mismatch of the expanded layout vanishes in float64.

    Expanding one row gives equal values along a dim, a point where
    normalisations divide by a variance of 0 and amplify rounding by
    1/sqrt(eps). A kernel that reads memory wrongly is wrong in every dtype;
    rounding shrinks by nine orders of magnitude in float64.
    """
    if isinstance(problem, OpRaised) or context.dtype in (None, torch.float64):
        return False
    try:
        prepared = prepare(context.case, sample, context.device, dtype=torch.float64)
        plan = _plan(context, prepared, layout, _Baseline(context, prepared).written)
        outputs = _forward(context, plan, set())
        cotangents, _ = _plain_cotangents(plan, outputs, context.generator)
        expected = _run(context, plan, set(), cotangents, outputs=outputs)
        return _difference(context, plan, expected, set(plan.laid), cotangents, True) is None
    except Exception as error:  # the op has no float64 path: the mismatch stands (a GPU fault is no such path)
        raise_if_fault(error)
        return False


def _difference(context, plan, expected, laid_slots, cotangents, laid_cotangent=False):
    """The first difference from ``expected``: OpRaised, or (what, argument, output, Mismatch); None if equal."""
    try:
        got = _run(context, plan, laid_slots, cotangents, laid_cotangent)
    except OpRaised as raised:
        return raised
    count = len(expected[0])
    for k, (want, have) in enumerate(zip(expected[0], got[0])):
        found = _compare(context, want, have)
        if found is not None:
            return output_label(k, count), None, output_label(k, count), found
    for name, want, have in zip(plan.source_names, expected[1], got[1]):
        found = _compare(context, want, have)
        if found is not None:
            return f"gradient w.r.t. `{name}`", name, None, found
    return None


def _compare(context, want, have):
    atol, rtol = context.tolerance(want.dtype)
    if agree(want, have, atol, rtol):
        return None
    return compare_tensors(want.detach(), have.detach(), atol, rtol)


def _everything(plan, cotangent_laid):
    return [f"`{name}`" for name, _, _ in plan.laid.values()] + (["grad_output"] if cotangent_laid else [])


def _report(context, layout, problem, who, together):
    situation = f"when {' and '.join(who)} {'is' if len(who) == 1 else 'are'} {layout.name}"
    details = [f"layout: {layout.description}"]
    if together:
        details.append("no single argument reproduces it alone: it needs several laid out together")
    if isinstance(problem, OpRaised):
        context.fail_raised(problem, situation, hint=HINT, details=details)
    what, argument, output, mismatch = problem
    label = what.replace("gradient w.r.t. ", "grad ").replace("`", "")
    context.fail(f"{what} differs from the contiguous run {situation}", worst=mismatch.worst(label),
                 error=mismatch.error_line(), argument=argument, output=output, details=details, hint=HINT)


check = NonContiguous()
