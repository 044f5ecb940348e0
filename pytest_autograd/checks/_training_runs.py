"""The op run the way a training step runs it, against its plain run: shared by the training-context checks.

checkpoint, offload, accumulation and overflow each run a sample's forward
and backward again inside something a training loop wraps around the op (a
checkpointed region, saved-tensor hooks, a second micro-batch, an
overflowing cotangent) and compare with the sample's plain run
(``_plain_run``): the op on the same inputs, from the same seed of torch's
generators, along the same cotangents. An op whose forward reads state that
changes from call to call (a random generator of its own, a step counter)
gives another result on every run whatever the context; where its plain
runs disagree the context is noted as not judged, never failed.
"""

import contextlib

import torch

from pytest_autograd.checks._agreement import agree
from pytest_autograd.checks._reruns import identical, seed_generators
from pytest_autograd.engine.execution import OpRaised, grads_of, output_label


def run_in(context, prepared, plain, around=None, cotangents=None, leaves=None, fn=None):
    """``(outputs, grads)`` of the op (or ``fn``) on ``prepared`` from the plain run's seed, forward and backward
    inside ``around()`` (a context manager, or None), along ``cotangents`` (default: the plain run's); detached."""
    seed_generators(context.device, plain.seed)
    leaves = prepared.leaves if leaves is None else leaves
    with around() if around is not None else contextlib.nullcontext():
        outputs = context.run_op(prepared, leaves, fn=fn)
        grads = grads_of(outputs, leaves, plain.cotangents if cotangents is None else cotangents)
    return [out.detach() for out in outputs], [grad.detach() for grad in grads]


def runs_agree(context, expected, got):
    """Whether two results of the op agree within the dtype's tolerance (widened to ``nondet_tol=``), as
    ``_reruns.compare_runs`` judges them, without failing."""
    if identical(expected, got):
        return True
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return False
    if not expected.is_floating_point():
        return bool(torch.equal(expected, got))
    atol, rtol = context.tolerance(expected.dtype)
    declared = context.case.option("nondet_tol", 0.0)
    if isinstance(declared, (int, float)) and not isinstance(declared, bool):
        atol = max(atol, float(declared))
    if agree(expected, got, atol, rtol):
        return True
    from pytest_autograd.results.compare import compare_tensors

    return compare_tensors(expected, got, atol, rtol) is None


def outputs_agree(context, expected, got):
    return len(expected) == len(got) and all(runs_agree(context, a, b) for a, b in zip(expected, got))


def reproducible(context, prepared, plain):
    """Whether the op, run again plainly from the plain run's seed, gives the plain run's outputs and gradients:
    False for an op reading state that changes between calls (its own generator, numpy's, a call counter)."""
    try:
        outputs, grads = run_in(context, prepared, plain)
    except OpRaised:
        return False
    return outputs_agree(context, plain.outputs, outputs) and outputs_agree(context, plain.grads, grads)


def not_reproducible_note(context, where):
    context.note(f"{context.check_name}: not judged {where}: two plain runs of the op from one seed of torch's "
                 "generators give different results (it reads state that changes between calls: a torch.Generator "
                 "of its own, numpy's or Python's random, a call counter), so no run in another context can be "
                 "compared with them")


def first_difference(context, expected, got, labels):
    """``(label, expected, got)`` of the first pair that disagrees, or None."""
    for label, a, b in zip(labels, expected, got):
        if not runs_agree(context, a, b):
            return label, a, b
    return None


def output_labels(outputs):
    return [output_label(k, len(outputs)) for k in range(len(outputs))]


def innermost(raised):
    """The op's own exception behind an OpRaised that wraps another (a forward recomputed inside backward)."""
    while isinstance(raised.error, OpRaised):
        raised = raised.error
    return raised


__all__ = ["first_difference", "innermost", "not_reproducible_note", "output_labels", "outputs_agree",
           "reproducible", "run_in", "runs_agree"]
