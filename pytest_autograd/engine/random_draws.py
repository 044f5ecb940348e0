"""Ops that draw from torch's global random generator: judged again with their draws fixed by position.

Dropout, noise injection and stochastic rounding draw new numbers on every
call. Two runs agree only when they draw the same ones: from one seed, and
in the same dtype, memory order and device (``torch.rand_like`` of a
transposed input draws in its memory order; float32 and float64 draws
differ; the CPU's and a GPU's generators differ). A check that compares runs
differing in one of those (precision's float32 run against float64, a
transposed input against a contiguous one, CPU against CUDA, the op against
a reference) names what differs (``Check.random_draws_differ``).

When such a check fails and the op draws from the global generator, the
runner runs the check again under :class:`FixedDraws`: every draw from the
global generator is replaced by numbers fixed by the tensor's shape and each
element's logical position, the same in every dtype, layout and device. The
check's verdict there is the verdict: a dropout whose runs differed only by
their masks passes (with a note), and a wrong op still fails, its draws alike
on both sides. Draws from a ``torch.Generator`` of the op's own, and the
checks' own draws, are left as they are.
"""

import math

import torch

from pytest_autograd.engine.dispatch_mode import DispatchMode

UNIFORM = {"rand", "rand_like", "uniform"}
NORMAL = {"randn", "randn_like", "normal"}
BERNOULLI = {"bernoulli"}
INTEGERS = {"randint", "randint_like", "random"}
RANDOM_OPS = UNIFORM | NORMAL | BERNOULLI | INTEGERS | {"randperm", "exponential"}


class FixedDraws(DispatchMode):
    """Draws from torch's global generator replaced by numbers fixed by shape and logical position; ``drew``
    tells whether the code run under it drew any."""

    def __init__(self):
        super().__init__()
        self.drew = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1].rstrip("_")
        if name == "native_dropout" and (args[2] if len(args) > 2 else None) is not False:  # F.dropout on CUDA
            self.drew = True
            return _fixed_dropout(args[0], args[1])
        result = func(*args, **kwargs)
        own_generator = kwargs.get("generator") is not None or any(isinstance(a, torch.Generator) for a in args)
        if name not in RANDOM_OPS or own_generator or not isinstance(result, torch.Tensor):
            return result
        if result.is_complex() or result.layout != torch.strided or not result.numel():
            return result
        self.drew = True
        fixed = _fixed_values(name, func, args, tuple(result.shape))
        if fixed is not None:
            with torch.no_grad():
                result.copy_(fixed)
        return result


def draws_from_global_generator(context, sample):
    """True when the op's forward on ``sample`` draws from torch's global generator (seen by :class:`FixedDraws`)."""
    from pytest_autograd.engine.execution import prepare, run_op

    mode = FixedDraws()
    try:
        with torch.random.fork_rng(devices=_cuda(context)), mode:
            run_op(context.case, prepare(context.case, sample, context.device))
    except Exception as error:  # an op that cannot run here: the failure stands as it is
        from pytest_autograd.engine.device_faults import raise_if_fault

        raise_if_fault(error)
        return False
    return mode.drew


def _cuda(context):
    from pytest_autograd.engine.devices import cuda_devices

    return cuda_devices(context.device)


def _uniform(shape, salt=0):
    """Uniform numbers in [0, 1), float64 on the CPU, fixed by ``shape`` (and ``salt``) and logical position."""
    generator = torch.Generator().manual_seed((hash(tuple(shape)) + salt) % (2 ** 62))
    return torch.rand(math.prod(shape), generator=generator, dtype=torch.float64).view(shape)


def _argument(args, position, default):
    return args[position] if len(args) > position and args[position] is not None else default


def _fixed_values(name, func, args, shape):
    """The fixed numbers one random op returns (float64 or int64 on the CPU), or None to leave its draw."""
    u = _uniform(shape)
    if name in UNIFORM:
        low, high = (_argument(args, 1, 0.0), _argument(args, 2, 1.0)) if name == "uniform" else (0.0, 1.0)
        return low + (high - low) * u
    if name in NORMAL:
        other = _uniform(shape, salt=1)
        standard = torch.sqrt(-2.0 * torch.log1p(-u)) * torch.cos(2 * torch.pi * other)
        if name == "normal":
            return _argument(args, 1, 0.0) + _argument(args, 2, 1.0) * standard
        return standard
    if name == "bernoulli":  # bernoulli_(self, p=0.5), bernoulli(self, p), or bernoulli(self) with self the p
        in_place = func._schema.name.endswith("_")
        p = _argument(args, 1, 0.5) if in_place or func._schema.overload_name == "p" else args[0]
        p = p.detach().to("cpu", torch.float64) if isinstance(p, torch.Tensor) else p
        return (u < p).to(torch.float64)
    if name == "exponential":
        return -torch.log1p(-u) / _argument(args, 1, 1.0)
    if name == "randperm":
        return torch.argsort(u)
    bounds = _integer_bounds(name, func, args)
    if bounds is None:
        return None
    low, high = bounds
    return (low + torch.floor(u * (high - low))).to(torch.int64)


def _fixed_dropout(input, p):
    """(output, mask) of ``native_dropout`` with the keep mask ``u < 1 - p``, as ``bernoulli_(1 - p)`` fixes it
    where the CPU's dropout draws through bernoulli."""
    keep = (_uniform(tuple(input.shape)) < 1 - p).to(input.device)
    scale = 1.0 / (1 - p) if p < 1 else 0.0
    return input * keep.to(input.dtype) * scale, keep


def _integer_bounds(name, func, args):
    """(low, high) of an integer draw, or None for one whose range is the dtype's (left as drawn)."""
    schema = func._schema.overload_name
    if name == "randint":
        return (args[0], args[1]) if schema.startswith("low") else (0, args[0])
    if name == "randint_like":
        return (args[1], args[2]) if schema.startswith("low") else (0, args[1])
    if name == "random":
        if schema == "from":
            return (args[1], args[2]) if args[2] is not None else None
        if schema == "to":
            return (0, args[1])
    return None


__all__ = ["FixedDraws", "draws_from_global_generator"]
