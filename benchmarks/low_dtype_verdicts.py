"""gradcheck's verdicts on ops computing below float64, with right, zero and half backwards, over many seeds.

Each op takes any dtype and computes in float32 (or bfloat16) inside, as
kernels that load their inputs ``.to(float32)`` do. A right backward must
never fail; a zero or half one must never pass (a skip says the check could
not judge). Prints one line per op and backward with the count of each
verdict:

    python benchmarks/low_dtype_verdicts.py --seeds 10
    python benchmarks/low_dtype_verdicts.py --seeds 20 --ops sin50_x100 bf16_tanh
"""

import argparse
import collections
import warnings

import torch

from pytest_autograd import run_checks


def computed_in(fn, backward, low):
    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return fn(x.to(low)).to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return backward(x.to(low), grad.to(low)).to(grad.dtype)

    return Op.apply


def autograd_backward(fn):
    def backward(x, grad):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            return torch.autograd.grad(fn(x), x, grad)[0]

    return backward


def rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


F32, BF16 = torch.float32, torch.bfloat16
OPS = {  # name: (function, dtype it computes in, sample from a generator)
    "tanh_x4": (torch.tanh, F32, lambda g: torch.randn(64, generator=g) * 4),
    "sin50_x100": (lambda x: torch.sin(50 * x), F32, lambda g: torch.randn(64, generator=g) * 100),
    "sin50_x1": (lambda x: torch.sin(50 * x), F32, lambda g: torch.randn(64, generator=g)),
    "relu": (torch.relu, F32, lambda g: torch.randn(64, generator=g)),
    "rms_norm_8": (rms_norm, F32, lambda g: torch.randn(8, 8, generator=g)),
    "rms_norm_1": (rms_norm, F32, lambda g: torch.randn(6, 1, generator=g)),
    "softmax": (lambda x: torch.softmax(x, -1), F32, lambda g: torch.randn(8, 16, generator=g)),
    "logsumexp": (lambda x: x.logsumexp(-1), F32, lambda g: torch.randn(8, 64, generator=g) * 5),
    "sort": (lambda x: x.sort(-1).values, F32, lambda g: torch.randn(4, 32, generator=g)),
    "cumsum_512": (lambda x: x.cumsum(-1), F32, lambda g: torch.randn(2, 512, generator=g)),
    "gelu": (torch.nn.functional.gelu, F32, lambda g: torch.randn(32, 32, generator=g)),
    "bf16_tanh": (torch.tanh, BF16, lambda g: torch.randn(64, generator=g) * 4),
    "bf16_gelu": (torch.nn.functional.gelu, BF16, lambda g: torch.randn(32, 32, generator=g)),
    "bf16_sin30": (lambda x: torch.sin(30 * x), BF16, lambda g: torch.randn(8, 8, generator=g)),
    "bf16_rms_norm_8": (rms_norm, BF16, lambda g: torch.randn(8, 8, generator=g)),
}
BACKWARDS = {
    "right": autograd_backward,
    "zero": lambda fn: (lambda x, grad: torch.zeros_like(x)),
    "half": lambda fn: (lambda x, grad: 0.5 * autograd_backward(fn)(x, grad)),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--ops", nargs="*", choices=sorted(OPS), default=list(OPS))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for name in args.ops:
        fn, low, make = OPS[name]
        for kind, backward in BACKWARDS.items():
            op = computed_in(fn, backward(fn), low)
            verdicts = collections.Counter()
            for seed in range(args.seeds):
                x = make(torch.Generator().manual_seed(seed))
                (outcome,) = run_checks(op, x, checks="gradcheck", seed=seed, shrink=0)
                verdicts[outcome.status] += 1
            print(f"{name:16s} {kind:6s} {dict(sorted(verdicts.items()))}", flush=True)


if __name__ == "__main__":
    main()
