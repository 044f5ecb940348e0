"""The offload check runs the op under saved-tensor hooks that hand backward a copy of each saved tensor."""

import textwrap

import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.training import PackedQKV, ScaledDropout, qkv_samples, samples

HINT = ("*hint: backward must read what forward saved through ctx.saved_tensors as values only: under offloading "
        "(save_on_cpu) or any saved-tensor hooks it gets a copy*")


def run(pytester, run_pytest, op, factory):
    pytester.makepyfile(test_ops=textwrap.dedent(f"""
        import pytest, torch
        from reference_ops.training import {op}, {factory}

        @pytest.mark.autograd_op(op={op})
        def test_op():
            return {factory}(torch.Generator().manual_seed(0))
    """))
    return run_pytest("--autograd-checks=offload")


def test_offload_fails_a_backward_reaching_past_a_saved_view_into_its_base(pytester, run_pytest):
    result = run(pytester, run_pytest, "PackedQKVReadsPastItsView", "qkv_samples")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the op's backward raised RuntimeError under saved-tensor hooks that pack a copy, though it runs plainly: "
        "setStorage: * out of bounds for storage of size *",
        "*check offload, device cpu, dtype float32, sample 0",
        "*at *reference_ops/training.py:* in backward",
        HINT + "do not reach past a saved view into its base's storage*",
    ])


def test_offload_fails_a_backward_relying_on_an_in_place_change_made_after_saving(pytester, run_pytest):
    result = run(pytester, run_pytest, "ScaledDropoutFinishesMaskInBackward", "samples")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient w.r.t. `x` under saved-tensor hooks that pack a copy differs from the plain run's",
        "*check offload, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*worst element: grad x[[]*[]]: plain run *, got *",
        "*each tensor forward saved was handed to backward as a copy holding the same values",
        HINT + "or change it in place after saving (through an alias kept on ctx)*",
    ])


def test_ops_that_read_saved_tensors_as_values_pass_under_offloading():
    for op, factory in ((PackedQKV, qkv_samples), (ScaledDropout, samples)):
        (outcome,) = run_checks(op, samples=factory(), checks=["offload"])
        assert outcome.status == "passed", (op.__name__, outcome.detail)


def test_a_saved_non_contiguous_view_is_handed_back_with_its_values_and_a_correct_op_passes():
    class TransposedProduct(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            at = a.t()  # saved as a transposed view
            ctx.save_for_backward(at, b)
            return at @ b

        @staticmethod
        def backward(ctx, grad):
            at, b = ctx.saved_tensors
            return (grad @ b.t()).t(), at.t() @ grad

    (outcome,) = run_checks(TransposedProduct, torch.randn(5, 3), torch.randn(5, 4), checks=["offload"])
    assert outcome.status == "passed", outcome.detail


def test_an_op_that_refuses_saved_tensor_hooks_in_forward_is_noted():
    def op(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("this kernel manages its own saved buffers"):
            return torch.sin(x)

    (outcome,) = run_checks(op, samples=samples(), checks=["offload"])
    assert outcome.status == "passed", outcome.detail
    assert "offload: not judged under saved-tensor hooks that pack a copy: the op's forward raises there " \
           "(RuntimeError: this kernel manages its own saved buffers" in outcome.detail
