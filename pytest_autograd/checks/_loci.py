"""Where a failure's numbers come from, as data: what a stand-alone script needs to recompute them.

A report's worst element is text; its locus (``Report.locus``, never
rendered) says which arguments were differentiated, in which dtype, which
output element or cotangent and which input element or direction gave the
expected and computed values, and the tolerance they were judged by. See
``engine/repro.py``, which writes the script.
"""

from pytest_autograd.checks._derivatives import ATOL, EPS, RTOL


def derivative_locus(error, context, prepared, order, first_cotangents=None, differentiable=None):
    """The locus of a first (``order`` 1) or second (2) derivative mismatch, or None when its origin is unknown."""
    if error.locus is None or prepared.complex_slots:
        return None
    case = context.case
    return {
        "kind": "derivative", "order": order, "slots": list(prepared.slots), "names": list(prepared.names),
        "dtype": "float64", "eps": EPS, "atol": case.option("atol", ATOL), "rtol": case.option("rtol", RTOL),
        "expected": error.expected, "got": error.got, "element_label": error.element, "argument": error.argument,
        "first_cotangents": None if first_cotangents is None else [c.detach().clone() for c in first_cotangents],
        "differentiable": differentiable, **error.locus,
    }


def compare_locus(prepared, dtype, what, index, mismatch, expected_label, got_label, output=None, argument=None,
                  cotangents=None, devices=None, fn=None):
    """The locus of an output or gradient of two runs that differ (op and reference, CPU and a device)."""
    if prepared.complex_slots:
        return None
    return {
        "kind": "compare", "what": what, "slots": list(prepared.slots), "names": list(prepared.names),
        "dtype": str(dtype).replace("torch.", ""), "output": output, "argument": argument, "element": tuple(index),
        "expected": mismatch.expected, "got": mismatch.got, "atol": mismatch.atol, "rtol": mismatch.rtol,
        "expected_label": expected_label, "got_label": got_label, "devices": devices, "expected_fn": fn,
        "cotangents": None if cotangents is None else [None if c is None else c.detach().to("cpu").clone()
                                                       for c in cotangents],
    }


def precision_locus(context, low_sample, dtype, violations, cotangents, k, floor):
    """The locus of a precision failure: the worst violation's tensor, run in ``dtype`` on ``low_sample`` (the
    rounded sample) against the float64 truth on the same values."""
    import torch

    worst = max(violations, key=lambda v: v.ratio)
    values = list(enumerate(low_sample.args)) + list(low_sample.kwargs.items())
    if any(isinstance(value, torch.Tensor) and value.is_complex() for _, value in values):
        return None  # complex arguments are differentiated as pairs of reals, which a script does not replay
    slots = [slot for slot, value in values
             if isinstance(value, torch.Tensor) and value.is_floating_point() and slot not in context.case.constant_slots]
    fields = worst.pair.fields
    output = fields.get("output")
    names = [context.case.arg_name(slot) for slot in slots]
    argument = fields.get("argument")
    return {
        "kind": "precision", "dtype": str(dtype).replace("torch.", ""), "slots": slots, "names": names,
        "what": "output" if output is not None else "gradient",
        "output": None if output is None else (0 if output == "output" else int(output.split()[-1])),
        "argument": None if argument is None else names.index(argument), "label": worst.pair.label,
        "element": tuple(worst.error.index), "expected": worst.error.expected, "got": worst.error.got,
        "error": worst.error.value, "budget": worst.budget, "k": k, "floor": floor,
        "reference_error": None if worst.ref_error is None else worst.ref_error.value,
        "truth": "reference" if context.case.reference is not None else "op",
        "cotangents": [None if c is None else c.detach().to("cpu").clone() for c in cotangents],
    }
