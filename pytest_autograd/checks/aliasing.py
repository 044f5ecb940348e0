"""aliasing: a caller's in-place change after forward is refused or harmless, never silently used by backward.

``ctx.save_for_backward`` ties each saved tensor to its version counter: if
the caller changes it in place before backward (``y.mul_(2)``, an in-place
activation next in the model, ``x.add_(...)`` on an input), backward raises
torch's "modified by an inplace operation" error. A tensor kept as
``ctx.y = y.detach()``, as a view, or as a plain ctx attribute escapes that
counter: backward then silently computes with the changed values.

Per sample, after forward the check multiplies every floating output in
place by -2 (exact in floating point), runs backward and expects either
torch's version-counter error or exactly the gradients of an unchanged run
whose cotangents are scaled by -2 (the chain rule through the in-place
multiply). Then it does the same to the op's floating inputs (those that
are not outputs or views of one), which must not change the gradients at all.

Torch refuses an in-place change in more than one way: besides the version
counter, a view made in no_grad mode (a Function's ``x.view(-1, n)`` saved
for backward) whose base is then changed makes backward raise "A view was
created in no_grad mode and its base ... has been modified inplace". Every
such refusal (``REFUSALS``) is the right answer, like the version error.
"""


from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._hygiene import call_with, shares_storage, tensor_arguments
from pytest_autograd.checks._plain_run import plain_run
from pytest_autograd.checks._reruns import compare_runs, seed_generators
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import (
    OpRaised,
    grads_of,
    output_label,
)

FACTOR = -2.0
VERSION_ERROR = "modified by an inplace operation"
# Torch's refusals of an in-place change, by a phrase of their message: each means the change was caught.
REFUSALS = (
    VERSION_ERROR,
    "was created in no_grad mode and its base or another view of its base has been modified inplace",
    "was created in inference mode and its base or another view of its base has been modified inplace",
    "is a view and is being modified inplace",
    "a view of a leaf Variable that requires grad is being used in an in-place operation",
)
HINT = ("save the tensors backward needs with ctx.save_for_backward(...) and read them from ctx.saved_tensors: "
        "a tensor kept as ctx.y = y.detach(), as a view or as a plain ctx attribute escapes autograd's version "
        "counter, so a later in-place change (an in-place activation, y.mul_(...)) silently changes the gradient")


class Aliasing(Check):
    name = "aliasing"
    description = ("after forward, in-place changes to outputs or inputs make backward raise one of torch's "
                   "in-place refusals or leave the gradients right, never silently change them")

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            if not prepared.leaves:
                continue
            baseline = _Baseline(context, index, prepared)
            for attempt in (_outputs_changed, _inputs_changed):
                refused, candidates = attempt(context, prepared, baseline, None)
                if refused and len(candidates) > 1:
                    # one tensor saved properly refuses the whole run: change each alone to see the others
                    for candidate in candidates:
                        attempt(context, prepared, baseline, {candidate})


class _Baseline:
    """Seed, cotangents and gradients of one unchanged run (the sample's plain run), shared by every attempt on a
    sample."""

    def __init__(self, context, index, prepared):
        self.context, self.prepared = context, prepared
        plain = plain_run(context, index, prepared)
        self.seed, self.cotangents = plain.seed, plain.cotangents
        self.differentiable = plain.differentiable
        self.grads = plain.grads if self.differentiable else None

    def grads_with(self, cotangents):
        """Gradients of an unchanged run for other cotangents (one more forward and backward)."""
        seed_generators(self.context.device, self.seed)
        return grads_of(self.context.run_op(self.prepared), self.prepared.leaves, cotangents)


def _outputs_changed(context, prepared, baseline, only):
    """Change the outputs (those in ``only``, default all) after forward; (refused, candidate positions)."""
    if not baseline.differentiable:
        return False, []
    seed_generators(context.device, baseline.seed)
    outputs = context.run_op(prepared)
    candidates = [k for k, out in enumerate(outputs) if out.is_floating_point()]
    changed = []
    for k in candidates:
        # an output aliasing one changed already would be scaled twice
        if (only is None or k in only) and not any(shares_storage(outputs[k], outputs[j]) for j in changed) \
                and _scale_in_place(outputs[k]):
            changed.append(k)
    if not changed:
        return False, candidates
    got = _backward_or_refused(prepared, outputs, baseline.cotangents)
    if got is None:
        return True, candidates
    carrying = [k for k, c in enumerate(baseline.cotangents) if c is not None and outputs[k].requires_grad]
    if all(k in changed for k in carrying):  # every gradient flows through one multiply by -2: linear, exact
        expected = [FACTOR * g for g in baseline.grads]
    else:
        expected = baseline.grads_with([c * FACTOR if c is not None and k in changed else c
                                        for k, c in enumerate(baseline.cotangents)])
    labels = ", ".join(f"`{output_label(k, len(outputs))}`" for k in changed)
    _compare(context, prepared, expected, got, f"the op's output {labels}",
             "multiplied {what} in place by -2 (as an in-place activation or y.mul_(...) would); the expected "
             "gradients follow the chain rule through that multiply")
    return False, candidates


def _inputs_changed(context, prepared, baseline, only):
    """Change the inputs (those named in ``only``, default all) after forward; (refused, candidate names)."""
    if not baseline.differentiable:
        return False, []
    seed_generators(context.device, baseline.seed)
    args, kwargs = prepared.call_args()
    arguments = tensor_arguments(context.case, args, kwargs)
    outputs = call_with(context.case, args, kwargs).outputs
    candidates = [name for _, name, tensor in arguments
                  if tensor.is_floating_point() and not any(shares_storage(tensor, out) for out in outputs)]
    changed = [name for _, name, tensor in arguments
               if name in candidates and (only is None or name in only) and _scale_in_place(tensor)]
    if not changed:
        return False, candidates
    got = _backward_or_refused(prepared, outputs, baseline.cotangents)
    if got is None:
        return True, candidates
    names = ", ".join(f"`{name}`" for name in changed)
    _compare(context, prepared, baseline.grads, got, f"the op's input {names}",
             "multiplied {what} in place by -2; the op's outputs were computed before, so the "
             "gradients must not change")
    return False, candidates


def _scale_in_place(tensor):
    """Multiply by -2 in place as a caller would; False when torch refuses (e.g. a view made in a Function)."""
    try:
        tensor.mul_(FACTOR)
    except RuntimeError:
        return False
    return True


def is_refusal(error):
    """True when ``error`` is torch refusing an in-place change (the version counter, a no_grad view's base...)."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(phrase in text for phrase in REFUSALS)


def _backward_or_refused(prepared, outputs, cotangents):
    """The gradients, or None when torch refused the changed tensors (the right answer)."""
    try:
        return grads_of(outputs, prepared.leaves, cotangents)
    except OpRaised as raised:
        if is_refusal(raised.error):
            return None
        raise


def _compare(context, prepared, expected, got, what, action):
    detail = (f"after forward, the check {action.format(what=what)}; torch's version counter did not object, "
              "and backward used the changed values")
    for name, a, b in zip(prepared.names, expected, got):
        compare_runs(context, a, b,
                     f"backward silently used values changed in place after forward: the gradient w.r.t. `{name}` "
                     f"changes when the caller modifies {what} in place", f"grad {name}",
                     hint=HINT, argument=name, details=[detail])


check = Aliasing()
