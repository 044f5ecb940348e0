"""bfloat16 training ops: judged against the reference in their own dtype, over long reductions, never failed for
a dtype they refuse by design.

A layer norm whose weight and bias gradients are summed in partial buffers
of the activations' dtype is far less accurate over 8192 rows than its
reference in bfloat16, yet within any fixed bfloat16 tolerance: precision
judges it by the reference's own error, on a long-reduction variant of the
sample. A bfloat16-only kernel raising TypeError for float32 and float64 is
judged in bfloat16 and noted for the dtypes it refuses.
"""

import pytest
import torch

from pytest_autograd.checks._long_reduction import LONG_ROWS, long_reduction_variants
from pytest_autograd.checks._transforms import DtypeRefusals, refuses_dtype
from pytest_autograd.engine.case import OpCase, Sample
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.triton_interpreter import interpreter_on

# Triton kernels run on CPU tensors in the interpreter (tests/conftest.py sets it without a GPU), compiled on CUDA
TRITON_DEVICE = "cpu" if interpreter_on() else "cuda"
needs_a_triton_device = pytest.mark.skipif(
    TRITON_DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1 set before triton is imported")

TORCH_OPS = """
import pytest, torch
from reference_ops.low_precision_reductions import *

@pytest.mark.autograd_op(op={op}, reference=layer_norm_reference{extra})
def test_layer_norm():
    return layer_norm_samples(torch.Generator().manual_seed(0))
"""

TRITON_OPS = """
import pytest, torch
from reference_ops.triton_layer_norm import *

@pytest.mark.autograd_op(op={op}, reference=layer_norm_bf16_reference{extra})
def test_layer_norm():
    return layer_norm_bf16_samples(torch.Generator().manual_seed(0))
"""


def run(pytester, run_pytest, template, op, *args, extra=""):
    pytester.makepyfile(test_ops=template.format(op=op, extra=extra))
    return run_pytest("-rs", *args)


def test_a_weight_gradient_summed_in_bfloat16_partials_fails_precision_against_the_reference_in_bfloat16(
        pytester, run_pytest):
    result = run(pytester, run_pytest, TORCH_OPS, "LayerNormInputDtypePartials", "--autograd-checks=precision")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `*` in bfloat16: error *, the reference in bfloat16 *: *x, budget 3x",
        "  check precision, device cpu, dtype bfloat16, sample 0",
        "  argument: *",
        "  worst element: grad *[[]*[]]: float64 *, got *",
        "  op error *, reference error * (each: max abs error / max |float64 value|, against the reference in "
        "float64 on the same rounded inputs); budget 3 x * + 1 ulp 0.0078125 = *",
        f"  on the long-reduction variant of sample 0: the sample's rows repeated * times along dim 0 (`x` to "
        f"{LONG_ROWS} x [[]24[]])",
    ], consecutive=True)
    # whether the bias is over its budget too depends on the order torch's threads add the bfloat16 partials
    result.stdout.fnmatch_lines([
        "  hint: a reduction accumulated in bfloat16: a gradient summed over many rows (a weight's or a bias's) in "
        "bfloat16 partial sums or an accumulator buffer allocated in the inputs' dtype loses precision with every "
        "term; accumulate in float32 and round to bfloat16 once at the end",
    ], consecutive=True)


def test_the_same_reduction_with_float32_partials_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, TORCH_OPS, "LayerNormFloat32Partials")
    assert result.ret == 0, result.stdout.str()
    assert "passed" in result.parseoutcomes()


def test_precision_k_on_the_marker_sets_the_16_bit_factor_too(pytester, run_pytest):
    result = run(pytester, run_pytest, TORCH_OPS, "LayerNormInputDtypePartials", "--autograd-checks=precision",
                 extra=", precision_k=100")
    result.assert_outcomes(passed=1)


@needs_a_triton_device
def test_a_bfloat16_only_triton_kernel_passes_every_default_check_noting_the_dtypes_it_refuses(pytester, run_pytest):
    result = run(pytester, run_pytest, TRITON_OPS, "TritonLayerNormBf16", f"--autograd-devices={TRITON_DEVICE}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        f"test_ops.py::test_layer_norm[[]precision-{TRITON_DEVICE}[]]",
        "  *test_ops.py:*: AutogradNote: precision: not judged in float32: the op refuses it "
        "(TypeError: layer_norm_bf16: bfloat16 tensors only, got torch.float32)",
        f"test_ops.py::test_layer_norm[[]extreme-{TRITON_DEVICE}[]]",
        "  *test_ops.py:*: AutogradNote: extreme: not judged in float32: the op refuses it "
        "(TypeError: layer_norm_bf16: bfloat16 tensors only, got torch.float32)",
    ])


@needs_a_triton_device
def test_a_triton_backward_with_bfloat16_partial_buffers_fails_precision(pytester, run_pytest):
    result = run(pytester, run_pytest, TRITON_OPS, "TritonLayerNormBf16Partials", "--autograd-checks=precision",
                 f"--autograd-devices={TRITON_DEVICE}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `*` in bfloat16: error *, the reference in bfloat16 *: *x, budget 3x",
        f"  check precision, device {TRITON_DEVICE}, dtype bfloat16, sample 0",
        "*on the long-reduction variant of sample 0: the sample's rows repeated * times along dim 0*",
        "  hint: a reduction accumulated in bfloat16*",
    ])


def test_an_op_refusing_every_dtype_precision_could_use_is_skipped_once_with_the_reason(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
        import pytest, torch

        def scale(x):
            if x.dtype != torch.float64:
                raise TypeError(f"scale: float64 only, got {x.dtype}")
            return 2 * x

        @pytest.mark.autograd_op(op=scale, checks=["precision", "extreme"])
        def test_scale():
            return [(torch.randn(3, 4, dtype=torch.float64),), (torch.randn(5, dtype=torch.float64),)]
    """)
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_ops.py:*: no dtype precision could check on cpu runs: float32 (the op refuses it: "
        "TypeError: scale: float64 only, got torch.float32); the samples' own dtype is judged by the other checks",
        "SKIPPED [[]1[]] test_ops.py:*: no dtype extreme could check on cpu runs: float32 (the op refuses it: *",
    ])


def test_a_dtype_declared_with_dtypes_that_the_op_refuses_still_fails(pytester, run_pytest):
    result = run(pytester, run_pytest, TRITON_OPS, "TritonLayerNormBf16", "--autograd-checks=precision",
                 extra=", dtypes=['float32', 'bfloat16']")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the op's forward raised TypeError: layer_norm_bf16: bfloat16 tensors only, got "
                                 "torch.float32"])


def test_a_mixed_precision_linear_with_float32_master_weights_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
        import pytest, torch
        from reference_ops.mixed_precision import MixedPrecisionLinear, mixed_linear_reference, mixed_linear_samples

        @pytest.mark.autograd_op(op=MixedPrecisionLinear, reference=mixed_linear_reference)
        def test_linear():
            return mixed_linear_samples(torch.Generator().manual_seed(0))
    """)
    result = run_pytest("-rs")
    assert result.ret == 0, result.stdout.str()


def _raised(error):
    return OpRaised("forward", error)


def test_refusals_are_errors_naming_a_dtype():
    assert refuses_dtype(_raised(TypeError("layer_norm_bf16: bfloat16 tensors only, got torch.float32")))
    assert refuses_dtype(_raised(RuntimeError("expected scalar type BFloat16 but found Float")))
    assert refuses_dtype(_raised(ValueError("unsupported dtype fp32")))
    assert not refuses_dtype(_raised(RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")))
    assert not refuses_dtype(_raised(IndexError("index 7 is out of bounds for dtype float32")))


def test_a_refusal_counts_only_for_a_dtype_the_samples_are_not_in():
    case = OpCase(op=None, samples=[Sample(torch.randn(3).bfloat16())])
    refusals = DtypeRefusals("precision", [torch.float32, torch.bfloat16], False, case)
    refusal = _raised(TypeError("bfloat16 tensors only"))
    assert refusals.refused(refusal, torch.float32)
    assert not refusals.refused(refusal, torch.bfloat16)  # the samples' own dtype: the op must run there
    assert not DtypeRefusals("precision", [torch.float32], True, case).refused(refusal, torch.float32)


def test_the_long_reduction_variant_repeats_the_rows_of_arguments_shaped_like_the_first():
    x, w, labels = torch.randn(6, 4), torch.randn(4), torch.arange(6)
    case = OpCase(op=None, samples=[], arg_names=["x", "w", "labels"])
    first, second = long_reduction_variants(case, Sample(x, w, labels))
    assert first.sample.args[0].shape == (6 * 1366, 4) and first.sample.args[1] is w
    assert first.sample.args[2] is labels  # another shape: only in the second candidate
    assert torch.equal(first.sample.args[0][6:12], x)
    assert second.sample.args[2].shape == (6 * 1366,)
    assert long_reduction_variants(case, Sample(torch.randn(5), w, labels)) == []  # no rows to repeat
    assert long_reduction_variants(case, Sample(torch.randn(LONG_ROWS, 2), w, labels)) == []  # already long


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16/bfloat16 defaults apply on CUDA only")
def test_on_cuda_the_float32_partials_pass_precision_in_every_default_dtype(pytester, run_pytest):
    result = run(pytester, run_pytest, TORCH_OPS, "LayerNormFloat32Partials", "--autograd-checks=precision",
                 "--autograd-devices=cuda")
    result.assert_outcomes(passed=1)
