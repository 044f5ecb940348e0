"""extreme: no inf/NaN at large and tiny magnitudes where the reference (or float64) is finite."""

import math

import torch

import pytest_autograd.checks.extreme  # noqa: F401
import reference_ops.transforms  # noqa: F401
from pytest_autograd.checks.extreme import magnitudes

OPS = """
import pytest
import torch
from reference_ops import Cube
from reference_ops.transforms import NaiveSoftmax, StableSoftmax, softmax_reference


def naive_normalize(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


@pytest.mark.autograd_op(op={op}{marker})
def test_op():
    return [(torch.randn(3, 5),), (torch.randn(7),)]
"""


def run(pytester, op, marker=""):
    pytester.makepyfile(test_ops=OPS.format(op=op, marker=marker))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=extreme", "-rs")


def test_a_naive_softmax_overflows_in_float32_and_fails(pytester):
    result = run(pytester, "NaiveSoftmax", ", reference=softmax_reference")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output is NaN in float32 for inputs scaled to max |x| = 177.446, where the reference in float32 is finite",
        "*check extreme, device cpu, dtype float32, sample 0",
        "*worst element: output[[]*]: the reference in float32 gives *, the op nan",
        "*elements are inf/NaN where the reference in float32 is finite",
        "*magnitude large: exp overflows*",
        "*hint: an intermediate overflows float32*subtract the max before exp*",
    ])


def test_without_a_reference_the_float64_op_is_the_judge(pytester):
    result = run(pytester, "NaiveSoftmax")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*output is NaN in float32 *, where the op in float64 is finite"])


def test_a_max_subtracted_softmax_passes_in_every_dtype(pytester):
    marker = ", reference=softmax_reference, dtypes=['float32', 'float16', 'bfloat16']"
    run(pytester, "StableSoftmax", marker).assert_outcomes(passed=1)


def test_overflow_the_dtype_cannot_avoid_is_not_a_failure(pytester):
    # x**3 of float16 inputs near 8..22 exceeds 65504: float64 is finite, but does not fit float16
    run(pytester, "Cube", ", dtypes=['float64', 'float32', 'float16']").assert_outcomes(passed=1)


def test_a_norm_whose_squares_underflow_fails_at_tiny_magnitude(pytester):
    result = run(pytester, "naive_normalize")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*output is inf in float32 for inputs scaled to max |x| = *e-23, where the op in float64 is finite",
        "*magnitude tiny: squares underflow to 0*",
        "*hint: an intermediate underflows to 0*",
    ])


def test_magnitudes_reach_the_edges_of_each_dtype():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        info = torch.finfo(dtype)
        values = dict(magnitudes(dtype))
        tiny = values["tiny: squares underflow to 0"]
        assert torch.tensor(tiny, dtype=dtype) > 0 and torch.tensor(tiny, dtype=dtype) ** 2 == 0
        assert math.exp(values["large: exp overflows"]) > info.max
        huge = torch.tensor(values["huge: products of four inputs still fit"], dtype=dtype)
        assert torch.isfinite(huge**4)


def test_a_reference_that_raises_is_blamed_instead_of_the_op(pytester):
    result = run(pytester, "Cube", marker=", reference=lambda x, scale: x ** 3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=lambda at test_ops.py:* raised TypeError in its forward: *missing 1 required positional argument: 'scale'",
    ])
