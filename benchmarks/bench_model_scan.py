"""What a model scan costs against the battery on the same ops with hand-written samples.

Three timings, each the median of ``--repeat`` runs after one untimed warm-up:

* ``scan``: ``autograd_scan(TinyTransformer(), x)``, the default checks on
  every custom op the shipped model runs (one forward and backward to
  capture, then each op on its captured signatures);
* ``capture``: the forward and backward with capture on, alone;
* ``battery``: ``run_checks`` with the default checks on each of the same
  ops, with the samples a person writes for an ``autograd_op`` test (the
  ``reference_ops`` sample factories), once with their references and once
  without (the scan has no reference, so that is the like-for-like figure).

On CPU the Triton RMSNorm runs in Triton's interpreter (set here before
triton is imported).

    python benchmarks/bench_model_scan.py
    python benchmarks/bench_model_scan.py --repeat 5 --extension
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_autograd.engine.api import run_checks  # noqa: E402
from pytest_autograd.engine.case import Sample  # noqa: E402
from pytest_autograd.engine.model_capture import capture_model  # noqa: E402
from pytest_autograd.engine.model_scan import autograd_scan  # noqa: E402
from reference_ops import functions  # noqa: E402
from reference_ops.model import TinyTransformer, model_inputs  # noqa: E402
from reference_ops.triton_ops import TritonRMSNorm, rms_norm_reference, rms_norm_samples  # noqa: E402


def hand_written(extension):
    """(op, samples, reference) for each op of the model, as an autograd_op test would write them."""
    generator = torch.Generator().manual_seed(0)
    ops = [
        (functions.LinearFunction, functions.linear_samples(generator), functions.linear_reference),
        (functions.MyReLU, functions.relu_samples(generator), functions.relu_reference),
        (functions.ElementwiseMul, functions.elementwise_mul_samples(generator), functions.elementwise_mul_reference),
        (functions.MulConstant, functions.mul_constant_samples(generator), functions.mul_constant_reference),
        (TritonRMSNorm, rms_norm_samples(generator), rms_norm_reference),
    ]
    if extension:
        ops.append((torch.ops.autograd_ext.linear_forward, functions.linear_samples(generator),
                    torch.nn.functional.linear))
    return ops


def battery(ops, with_reference):
    statuses = []
    for op, samples, reference in ops:
        outcomes = run_checks(op, samples=[Sample(*s) for s in samples], reference=reference if with_reference else None)
        statuses += [o.status for o in outcomes]
    return statuses


def timed(function, repeat):
    function()  # warm-up: imports every check, compiles nothing twice
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--extension", action="store_true", help="use the C++ extension's operator (builds it)")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = TinyTransformer(extension=options.extension)
    inputs = model_inputs()
    ops = hand_written(options.extension)

    scan_s, result = timed(lambda: autograd_scan(model, *inputs), options.repeat)
    capture_s, capture = timed(lambda: capture_model(model, [Sample(*inputs)]), options.repeat)
    with_reference_s, _ = timed(lambda: battery(ops, True), options.repeat)
    without_reference_s, statuses = timed(lambda: battery(ops, False), options.repeat)

    signatures = sum(len(v.checked) for v in result.verdicts)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}, median of {options.repeat}")
    print(f"model: {len(capture.calls)} custom op calls, {len(result.verdicts)} ops, {signatures} signatures checked; "
          f"{result.summary()}")
    print(f"  scan (capture + default checks on each signature)   {scan_s:8.2f} s")
    print(f"    of which the capture (one forward and backward)     {capture_s:8.3f} s")
    print(f"  battery, hand-written samples, with references       {with_reference_s:8.2f} s  "
          f"({len(ops)} ops, {sum(len(s) for _, s, _ in ops)} samples)")
    print(f"  battery, hand-written samples, no reference          {without_reference_s:8.2f} s  "
          f"({statuses.count('failed')} failed)")
    print(f"  scan / battery without reference: {scan_s / without_reference_s:.2f}x; "
          f"with references: {scan_s / with_reference_s:.2f}x")


if __name__ == "__main__":
    main()
