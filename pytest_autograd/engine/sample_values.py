"""Refusing sample tensors no check can judge: non-finite values, sparse, nested and meta tensors.

A NaN or an infinity in a differentiated input turns every numerical
derivative around it into NaN, and comparisons against NaN say nothing: a
backward 1.5x too large then passes gradcheck. Sparse, nested and meta
tensors have no dense values to perturb or compare. Each is refused once,
when the samples are built, with the argument and the element named.
Checks that feed non-finite values on purpose (extreme) build those inputs
inside themselves. Arguments declared ``constants=`` (e.g. an attention mask
holding -inf) are never differentiated, so they may hold non-finite values.
"""

from pytest_autograd.engine.outcomes import UsageProblem


def validate_sample_values(case, where):
    """Raise UsageProblem for the first sample tensor the checks cannot use."""
    import torch

    for index, sample in enumerate(case.samples):
        slots = list(enumerate(sample.args)) + list(sample.kwargs.items())
        for slot, value in slots:
            if not isinstance(value, torch.Tensor):
                continue
            label = f"{where}: sample {index} argument `{case.arg_name(slot)}`"
            _refuse_layout(value, label)
            if slot in case.constant_slots or not (value.is_floating_point() or value.is_complex()):
                continue
            _refuse_non_finite(value, label, case.arg_name(slot))


def _refuse_layout(value, label):
    import torch

    if value.is_nested:
        raise UsageProblem(
            f"{label} is a nested tensor; the checks perturb and compare dense tensors. Check a wrapper that "
            "takes the dense components and builds the nested tensor inside, e.g. "
            "op=lambda a, b: my_op(torch.nested.nested_tensor([a, b]))."
        )
    if value.layout != torch.strided:
        layout = str(value.layout).replace("torch.", "")
        raise UsageProblem(
            f"{label} is a {layout} tensor; the checks perturb and compare dense (strided) tensors. Pass "
            "x.to_dense(), or check a wrapper that builds the sparse tensor inside, e.g. "
            "op=lambda dense: my_op(dense.to_sparse())."
        )
    if value.device.type == "meta":
        raise UsageProblem(
            f"{label} is on the meta device, which holds no values to differentiate or compare. Build samples "
            "from real data on the CPU (torch.randn(...)); the plugin moves them to each device."
        )


def _refuse_non_finite(value, label, name):
    import torch

    finite = torch.isfinite(value.detach())
    if bool(finite.all()):
        return
    bad = (~finite).nonzero()
    first = tuple(int(i) for i in bad[0]) if bad.numel() else ()
    element = value.detach()[first].item()
    index = "[" + ", ".join(map(str, first)) + "]"
    raise UsageProblem(
        f"{label} holds {element} at {index} ({bad.shape[0]} non-finite element(s) of {value.numel()}). "
        "Numerical derivatives around a NaN or an infinity are NaN, so no derivative check could fail there. "
        "Use finite samples (the extreme check already feeds large and tiny magnitudes); if the argument is "
        f"a constant such as a mask, declare it on the marker: constants=({name!r},)."
    )
