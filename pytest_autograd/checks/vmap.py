"""vmap: ``torch.func.vmap`` over a Function equals a loop over examples.

A Function's ``vmap`` staticmethod (or the rule ``generate_vmap_rule = True``
derives) is code gradcheck never runs: ``check_batched_grad`` uses a legacy
vmap that does not reach it. Each tensor argument is batched alone, at dim 0
and at its last dim (a rule that assumes dim 0 shows there), the others
unbatched (``None`` in in_dims), then all together; outputs and, through
``torch.func.vjp`` under vmap, per-example gradients must equal the loop.
"""

import torch

from pytest_autograd.checks._transforms import overrides
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    differentiable_indices,
    flatten_outputs,
    floating_dtype,
    grads_of,
    output_label,
    random_cotangents,
)
from pytest_autograd.engine.outcomes import raised_by_op

BATCH = 3
SETUP_CONTEXT_HINT = ("torch.func transforms need the setup_context style: forward(*inputs) without ctx, plus "
                      "@staticmethod setup_context(ctx, inputs, output) that saves what backward needs")
RULE_HINT = ("a vmap staticmethod gets (info, in_dims, *args), where in_dims[i] is the batch dim of args[i] or "
             "None when it is not batched; it must return (outputs, out_dims) with the batch dim of each output")
BACKWARD_HINT = ("under vmap, backward runs once on batched tensors: it must use out-of-place torch ops only "
                 "(no .item(), no in-place writes into freshly allocated buffers, no shapes taken from "
                 "grad_output to build unbatched tensors)")


class Vmap(Check):
    name = "vmap"
    description = "torch.func.vmap of a Function (outputs and vjp) equals the per-example loop"

    def applies(self, case, device):
        if not case.is_function:
            return "op is not an autograd.Function: vmap checks a Function's own vmap rule"
        if not (overrides(case.op, "vmap") or getattr(case.op, "generate_vmap_rule", False)):
            return "op defines no vmap rule (neither a vmap staticmethod nor generate_vmap_rule = True)"
        if not any(isinstance(v, torch.Tensor) for s in case.samples for v in s.args):
            return "no positional tensor argument to batch"
        return None

    def run(self, context):
        case = context.case
        if not overrides(case.op, "setup_context"):
            how = "defines a vmap staticmethod" if overrides(case.op, "vmap") else "sets generate_vmap_rule = True"
            context.fail(f"{case.name} {how}, but its forward takes ctx, so torch.func.vmap refuses it",
                         hint=SETUP_CONTEXT_HINT)
        for index, sample in context.samples():
            examples = _examples(sample, context.device, context.generator)
            context.dtype = floating_dtype(sample)
            for where, in_dims in _configurations(sample, case):
                _check_outputs(context, sample, examples, where, in_dims)
                _check_vjp(context, sample, examples, where, in_dims)


def _examples(sample, device, generator):
    """BATCH argument lists: the sample itself, then copies with perturbed floating tensors."""
    examples = []
    for i in range(BATCH):
        args = []
        for value in sample.args:
            if isinstance(value, torch.Tensor):
                value = value.detach().to(device)
                if i and value.is_floating_point():
                    noise = torch.randn(value.shape, generator=generator, dtype=torch.float64)
                    value = value + (0.25 * noise).to(device=device, dtype=value.dtype)
            args.append(value)
        examples.append(args)
    return examples


def _configurations(sample, case):
    """(description, in_dims) pairs: each tensor alone at dim 0 and at its last dim, then all at 0."""
    positions = [p for p, v in enumerate(sample.args) if isinstance(v, torch.Tensor)]
    configurations = []
    for p in positions:
        name = f"`{case.arg_name(p)}`"
        configurations.append((f"{name} batched at dim 0", {p: 0}))
        if sample.args[p].dim() >= 1:
            configurations.append((f"{name} batched at its last dim ({sample.args[p].dim()})",
                                   {p: sample.args[p].dim()}))
    if len(positions) > 1:
        configurations.append(("every tensor argument batched at dim 0", {p: 0 for p in positions}))
    return configurations


def _batched_args(examples, in_dims):
    args = []
    for p, value in enumerate(examples[0]):
        if p in in_dims:
            value = torch.stack([example[p] for example in examples], dim=in_dims[p])
        args.append(value.clone() if isinstance(value, torch.Tensor) else value)
    return args


def _example_args(examples, in_dims, i):
    return [(examples[i][p] if p in in_dims else value).clone() if isinstance(value, torch.Tensor) else value
            for p, value in enumerate(examples[0])]


def _call(case, args, kwargs):
    """The op on one example, outside vmap: its own failures are the op's, not the rule's."""
    try:
        return flatten_outputs(case.call(*args, **kwargs))
    except Exception as error:
        raise raised_by_op("forward", error) from error


def _dims_text(sample, in_dims):
    return "in_dims=(" + ", ".join(str(in_dims.get(p)) for p in range(len(sample.args))) + ")"


def _details(sample, in_dims):
    return [f"{_dims_text(sample, in_dims)}; batched results are compared with the batch index first"]


def _vmap_failed(context, sample, where, in_dims, error, what, hint):
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    details = [_dims_text(sample, in_dims)]
    frame = OpRaised(what, error).where()
    if frame:
        details.append(f"at {frame}")
    context.fail(f"{what} raised {type(error).__name__} with {where}: {message}", details=details,
                 hint=SETUP_CONTEXT_HINT if "setup_context" in message else hint)


def _mismatch_hint(in_dims):
    if any(d for d in in_dims.values()):
        return ("the batch dim here is not dim 0: a rule that assumes it is fails like this; move it first, "
                "e.g. x = x.movedim(in_dims[0], 0), and return out_dims accordingly")
    return RULE_HINT


def _check_outputs(context, sample, examples, where, in_dims):
    case = context.case
    kwargs = sample.kwargs
    with torch.no_grad():
        per_example = [_call(case, _example_args(examples, in_dims, i), kwargs) for i in range(BATCH)]
        try:
            result = torch.func.vmap(lambda *args: case.op.apply(*args, **kwargs),
                                     in_dims=tuple(in_dims.get(p) for p in range(len(sample.args))))(
                *_batched_args(examples, in_dims))
        except Exception as error:  # reported with the in_dims that triggered it
            _vmap_failed(context, sample, where, in_dims, error, "torch.func.vmap(op)", _mismatch_hint(in_dims))
    got = flatten_outputs(result)
    count = len(per_example[0])
    if len(got) != count:
        context.fail(f"vmap(op) returned {len(got)} tensor output(s), the op returns {count}", hint=RULE_HINT)
    for k in range(count):
        label = output_label(k, count)
        expected = torch.stack([outputs[k] for outputs in per_example])
        context.compare(expected, got[k], f"vmap(op) with {where}: {label} differs from the per-example loop",
                        label, output=label, details=_details(sample, in_dims), hint=_mismatch_hint(in_dims))


def _check_vjp(context, sample, examples, where, in_dims):
    case = context.case
    kwargs = sample.kwargs
    leaves = [p for p, v in enumerate(sample.args) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not leaves:
        return
    expected, cotangents, diff = [], [], None
    for i in range(BATCH):
        args = _example_args(examples, in_dims, i)
        leaf_tensors = [args[p].requires_grad_(True) for p in leaves]
        for p, leaf in zip(leaves, leaf_tensors):
            args[p] = leaf.clone()  # an in-place op must not touch the leaf
        outputs = _call(case, args, kwargs)
        if diff is None:
            diff = differentiable_indices(outputs)
            if not diff:
                return
        cot = random_cotangents([outputs[k] for k in diff], context.generator)
        expected.append([g.detach() for g in grads_of([outputs[k] for k in diff], leaf_tensors, cot)])
        cotangents.append(cot)

    def per_example(*values):
        args, cot = list(values[:len(sample.args)]), values[len(sample.args):]

        def differentiable(*leaf_values):
            full = list(args)
            for p, value in zip(leaves, leaf_values):
                full[p] = value
            outputs = flatten_outputs(case.op.apply(*full, **kwargs))
            return tuple(outputs[k] for k in diff)

        _, pullback = torch.func.vjp(differentiable, *[args[p] for p in leaves])
        return pullback(tuple(cot))

    batched_cot = [torch.stack([c[j] for c in cotangents]) for j in range(len(diff))]
    dims = tuple(in_dims.get(p) for p in range(len(sample.args))) + (0,) * len(diff)
    try:
        got = torch.func.vmap(per_example, in_dims=dims)(*_batched_args(examples, in_dims), *batched_cot)
    except Exception as error:  # reported with the in_dims that triggered it
        _vmap_failed(context, sample, where, in_dims, error, "vmap(vjp(op)) (the backward under vmap)", BACKWARD_HINT)
    for j, p in enumerate(leaves):
        name = case.arg_name(p)
        want = torch.stack([grads[j] for grads in expected])
        context.compare(want, got[j].detach(),
                        f"vmap(vjp(op)) with {where}: per-example gradient w.r.t. `{name}` differs from the loop",
                        f"grad {name}", argument=name, details=_details(sample, in_dims),
                        hint=BACKWARD_HINT)


check = Vmap()
