"""Time the autograd_ext linear layer against torch.nn.functional.linear.

For each square size n (batch = in_features = out_features = n) this measures
forward, backward and forward+backward of ``ExtLinear`` and of an equivalent
``F.linear`` with identical parameters, and prints the ratio ext / torch
(1.00 = as fast as PyTorch; on CUDA the baseline is cuBLAS).

TF32 is disabled so that float32 is compared with true float32 GEMMs.
CUDA timings use CUDA events; every number is the median of ``--iters``
repetitions after ``--warmup`` untimed ones.

    python benchmarks/bench_extension.py                  # CUDA if present, then CPU
    python benchmarks/bench_extension.py --device cpu --sizes 256 512
    python benchmarks/bench_extension.py --dtype float16 --sizes 4096
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from reference_ops.extension import ExtLinear, load_extension  # noqa: E402

CUDA_SIZES = (1024, 2048, 4096)
CPU_SIZES = (128, 256, 512)


def time_ms(fn: Callable[[], object], device: str, warmup: int, iters: int) -> float:
    """Median wall time of fn() in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def bench_size(n: int, device: str, dtype: torch.dtype, warmup: int, iters: int) -> list[tuple]:
    """Rows of (pass, ext_ms, torch_ms, gemm_flops) for one problem size."""
    torch.manual_seed(0)
    module = ExtLinear(n, n, device=device, dtype=dtype)
    weight, bias = module.weight, module.bias
    x = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(n, n, device=device, dtype=dtype)
    wrt = (x, weight, bias)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(x)
        return run

    def backward(fn):
        out = fn(x)  # graph built once, replayed with retain_graph
        return lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True)

    def forward_backward(fn):
        return lambda: torch.autograd.grad(fn(x), wrt, grad_out)

    ext_fn = module
    torch_fn = lambda inp: F.linear(inp, weight, bias)  # noqa: E731
    flops = 2.0 * n * n * n  # one GEMM
    rows = []
    for name, make, gemms in (("forward", forward, 1), ("backward", backward, 2), ("fwd+bwd", forward_backward, 3)):
        ext_ms = time_ms(make(ext_fn), device, warmup, iters)
        torch_ms = time_ms(make(torch_fn), device, warmup, iters)
        rows.append((name, ext_ms, torch_ms, gemms * flops))
    return rows


def report(device: str, sizes, dtype: torch.dtype, warmup: int, iters: int) -> None:
    baseline = "cuBLAS" if device == "cuda" else "torch"
    print(f"\n{device.upper()}  dtype={dtype}  (median of {iters}, {warmup} warm-up)")
    header = f"{'n':>6} {'pass':>9} {'ext ms':>10} {baseline + ' ms':>11} {'ext/' + baseline:>12} {'ext TFLOP/s':>12}"
    print(header)
    print("-" * len(header))
    for n in sizes:
        for name, ext_ms, torch_ms, flops in bench_size(n, device, dtype, warmup, iters):
            tflops = flops / (ext_ms * 1e-3) / 1e12
            print(f"{n:>6} {name:>9} {ext_ms:>10.3f} {torch_ms:>11.3f} {ext_ms / torch_ms:>12.2f} {tflops:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--sizes", type=int, nargs="+", help="square problem sizes n")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64", "float16", "bfloat16"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    load_extension(verbose=False)

    devices = ["cuda", "cpu"] if args.device == "auto" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            parser.error("CUDA is not available")
        devices.remove("cuda")
    for device in devices:
        if device == "cpu" and dtype in (torch.float16, torch.bfloat16):
            print(f"\nCPU: skipped, {dtype} is only supported on CUDA")
            continue
        sizes = args.sizes or (CUDA_SIZES if device == "cuda" else CPU_SIZES)
        report(device, sizes, dtype, args.warmup, args.iters)


if __name__ == "__main__":
    main()
