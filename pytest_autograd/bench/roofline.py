"""FLOPs and bytes per call, hence TFLOP/s, GB/s and arithmetic intensity.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls,
convolutions, attention; element-wise work counts zero) on the reference
when there is one, else on the op. Bytes are the ideal traffic: every
tensor read or written once. Marker options ``flops=`` / ``bytes=``
override either: a number (forward), a dict per direction, or a callable
taking the sample's arguments and returning one of those.
"""

from pytest_autograd.bench.config import DIRECTIONS, BadSetting

FORWARD, BACKWARD, BOTH = DIRECTIONS


def tensor_bytes(values):
    """Bytes of the distinct tensors among ``values`` (a tensor passed twice is read once)."""
    import torch

    seen, total = set(), 0
    for value in values:
        if isinstance(value, torch.Tensor):
            size = value.numel() * value.element_size()
            key = (value.data_ptr(), size) if value.data_ptr() else id(value)
            if key not in seen:
                seen.add(key)
                total += size
    return total


def ideal_bytes(inputs, outputs, differentiable_outputs, leaves):
    """Ideal traffic per direction: forward reads inputs, writes outputs; backward reads
    the output gradients and the saved inputs and writes the input gradients."""
    forward = tensor_bytes(inputs) + tensor_bytes(outputs)
    result = {FORWARD: forward, BACKWARD: None, BOTH: None}
    if differentiable_outputs and leaves:
        backward = tensor_bytes(differentiable_outputs) + tensor_bytes(inputs) + tensor_bytes(leaves)
        result[BACKWARD] = backward
        result[BOTH] = forward + backward
    return result


def count_flops(run_forward, run_backward):
    """FLOPs of one forward and of one backward, counted by FlopCounterMode.

    ``run_forward()`` returns the outputs that ``run_backward(outputs)``
    differentiates (None: no backward). Any failure of the counter gives
    None: rates are then left out rather than wrong.
    """
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter:
            outputs = run_forward()
        forward = counter.get_total_flops()
        backward = None
        if run_backward is not None:
            with FlopCounterMode(display=False) as counter:
                run_backward(outputs)
            backward = counter.get_total_flops()
    except Exception:  # the counter cannot see every op (e.g. some custom kernels)
        return {FORWARD: None, BACKWARD: None, BOTH: None}
    return with_total({FORWARD: forward, BACKWARD: backward})


def with_total(per_direction):
    result = {FORWARD: per_direction.get(FORWARD), BACKWARD: per_direction.get(BACKWARD),
              BOTH: per_direction.get(BOTH)}
    if result[BOTH] is None and result[FORWARD] is not None and result[BACKWARD] is not None:
        result[BOTH] = result[FORWARD] + result[BACKWARD]
    return result


def resolve(override, counted, args, kwargs, what):
    """Apply a ``flops=`` / ``bytes=`` marker option to the automatic figures."""
    if override is None:
        return with_total(counted)
    value = override(*args, **kwargs) if callable(override) else override
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(DIRECTIONS))
        if unknown:
            raise BadSetting(f"{what}= has unknown direction(s) {', '.join(map(repr, unknown))}; "
                             f"use {', '.join(map(repr, DIRECTIONS))}")
        given = dict(value)
    else:
        given = {FORWARD: value}
    for direction, number in given.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
            raise BadSetting(f"{what}= must give non-negative numbers, got {number!r} for {direction}")
    merged = {**{k: v for k, v in counted.items() if k != BOTH}, **given}
    if BOTH not in given:
        merged.pop(BOTH, None)
    return with_total(merged)


def rates(flops, nbytes, seconds):
    """(TFLOP/s, GB/s, FLOP per byte), each None where unknown."""
    tflops = flops / seconds / 1e12 if flops and seconds else None
    gbps = nbytes / seconds / 1e9 if nbytes and seconds else None
    intensity = flops / nbytes if flops and nbytes else None
    return tflops, gbps, intensity
