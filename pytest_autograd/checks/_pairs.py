"""Run two implementations on the same sample and compare outputs and gradients.

Used by parity (device vs CPU) and reference (op vs reference). Both sides
get the same cotangent, so gradients are comparable element by element.
"""

from pytest_autograd.engine.execution import grads_of, output_label, random_cotangents


def compare_runs(context, expected_side, got_side, expected_label, got_label):
    """Each side: (prepared, outputs). Fails on the first differing output or gradient."""
    (expected_prepared, expected_outputs), (got_prepared, got_outputs) = expected_side, got_side
    if len(expected_outputs) != len(got_outputs):
        context.fail(
            f"{got_label} returned {len(got_outputs)} tensor output(s), {expected_label} returned {len(expected_outputs)}",
        )
    count = len(expected_outputs)
    for k, (expected, got) in enumerate(zip(expected_outputs, got_outputs)):
        label = output_label(k, count)
        if expected.dtype != got.dtype:
            context.fail(f"{label} of {got_label} has dtype {got.dtype}, {expected_label} gives {expected.dtype}",
                         output=label)
        context.compare(expected, got.to(expected.device), f"{label} of {got_label} differs from {expected_label}",
                        label, output=label)
    cotangents = random_cotangents(expected_outputs, context.generator, device="cpu")
    paired = [(e, g, c) for e, g, c in zip(expected_outputs, got_outputs, cotangents)
              if c is not None and (e.requires_grad or g.requires_grad)]
    if not paired or not expected_prepared.leaves:
        return
    for e, g, c in paired:
        if e.requires_grad and not g.requires_grad:
            k = expected_outputs.index(e)
            context.fail(f"{output_label(k, count)} of {got_label} does not require grad, but {expected_label}'s does",
                         output=output_label(k, count),
                         hint="forward returned a tensor detached from the graph")
    expected_grads = grads_of([e for e, _, _ in paired], expected_prepared.leaves,
                              [c.to(e.device) for e, _, c in paired])
    got_grads = grads_of([g for _, g, _ in paired], got_prepared.leaves,
                         [c.to(g.device) for _, g, c in paired])
    for name, expected, got in zip(expected_prepared.names, expected_grads, got_grads):
        context.compare(expected.detach(), got.detach().to(expected.device),
                        f"gradient w.r.t. `{name}` from {got_label} differs from {expected_label}",
                        f"grad {name}", argument=name,
                        hint=_grad_hint(expected, got))


def _grad_hint(expected, got):
    if bool((got == 0).all()) and not bool((expected == 0).all()):
        return "the gradient is all zeros (backward returned None for this input?)"
    if expected.shape == got.shape and expected.dim() == 2 and expected.shape[0] == expected.shape[1]:
        if bool(((expected.transpose(0, 1) - got.to(expected.device)).abs() <= 1e-6 * (1 + expected.abs())).all()):
            return "the gradient is the transpose of the expected one"
    return None
