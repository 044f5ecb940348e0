"""vmap: torch.func.vmap over a Function (outputs, and vjp under vmap) equals the per-example loop."""

import pytest
import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.transforms import RowDot

OPS = """
import pytest
import torch
from reference_ops import ElementwiseMul, LinearFunctionSetupContext
from reference_ops.transforms import RowDot, RowDotVmapAssumesDimZero


class RowDotBackwardWritesInPlace(RowDot):
    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_x = torch.zeros(x.shape, dtype=x.dtype)
        grad_x.copy_(grad_output.unsqueeze(-1) * weight)  # a batched value into an unbatched buffer
        return grad_x, (grad_output.unsqueeze(-1) * x).reshape(-1, x.shape[-1]).sum(0)


class DoubleOldStyle(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * 2


@pytest.mark.autograd_op(op={op})
def test_op():
    return {samples}
"""
ROW_DOT_SAMPLES = "[(torch.randn(3, 3), torch.randn(3)), (torch.randn(2, 3, 4), torch.randn(4))]"


@pytest.fixture(scope="module", autouse=True)
def torch_machinery_imported():
    """Run the check once before any in-process pytester run: pytester drops modules first
    imported during a run, and parts of torch refuse to be imported twice."""
    run_checks(RowDot, torch.randn(2, 3), torch.randn(3), checks="vmap")


def run(pytester, op, samples=ROW_DOT_SAMPLES):
    pytester.makepyfile(test_ops=OPS.format(op=op, samples=samples))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--autograd-checks=vmap", "-rs")


def test_a_rule_that_assumes_the_batch_dim_is_first_fails_at_a_last_dim_batch(pytester):
    result = run(pytester, "RowDotVmapAssumesDimZero")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*vmap(op) with `x` batched at its last dim (2): output differs from the per-example loop",
        "*check vmap, device cpu, dtype float32, sample 0",
        "*worst element: output*: expected *, got *",
        "*in_dims=(2, None); batched results are compared with the batch index first",
        "*hint: the batch dim here is not dim 0*movedim*",
    ])


def test_correct_rules_pass_whether_written_by_hand_or_derived(pytester):
    run(pytester, "RowDot").assert_outcomes(passed=1)
    linear = "[(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)), (torch.randn(2, 3, 4), torch.randn(5, 4), None)]"
    run(pytester, "LinearFunctionSetupContext", linear).assert_outcomes(passed=1)


def test_a_backward_that_cannot_run_batched_fails_under_vmap_of_vjp(pytester):
    result = run(pytester, "RowDotBackwardWritesInPlace")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*vmap(vjp(op)) (the backward under vmap) raised RuntimeError with `x` batched at dim 0: vmap: *",
        "*at *test_ops.py:* in backward",
        "*hint: under vmap, backward runs once on batched tensors*",
    ])


def test_an_old_style_function_claiming_vmap_support_fails_with_the_fix(pytester):
    result = run(pytester, "DoubleOldStyle", "[(torch.randn(3),)]")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*DoubleOldStyle sets generate_vmap_rule = True, but its forward takes ctx*",
        "*hint: torch.func transforms need the setup_context style*",
    ])


def test_a_function_without_a_vmap_rule_is_skipped_with_the_reason(pytester):
    result = run(pytester, "ElementwiseMul", "[(torch.randn(3), torch.randn(3))]")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*op defines no vmap rule*"])
