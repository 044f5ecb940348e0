"""The Triton RMSNorm (kernels with a hand-written backward) through the whole battery.

Without a GPU the kernels run in Triton's interpreter on CPU tensors
(``tests/conftest.py`` switches it on before triton is imported). On a GPU,
without ``TRITON_INTERPRET``, the same tests run the compiled kernels on
CUDA: the kernels then take CUDA tensors only, so the marked tests run on
``cuda`` and parity, which needs a CPU run as ground truth, is left to the
reference check (the CUDA run against plain torch).
"""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install -e '.[triton]' installs it")

from pytest_autograd.engine.triton_interpreter import interpreter_on  # noqa: E402
from reference_ops.triton_ops import (  # noqa: E402
    ROWS_PER_PROGRAM,
    TritonRMSNorm,
    rms_norm_op,
    rms_norm_triton_op,
    rms_norm_reference,
    rms_norm_samples,
    rms_norm_with_rstd_reference,
)

if not interpreter_on() and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1 set before triton is imported",
                allow_module_level=True)

KERNEL_DEVICE = "cpu" if interpreter_on() else "cuda"
NATIVE = {} if interpreter_on() else {"devices": ["cuda"], "skip": ["parity"]}


@pytest.mark.autograd_op(op=TritonRMSNorm, reference=rms_norm_reference, double_backward=False, **NATIVE)
def test_triton_rms_norm_function_passes_every_default_check():
    return rms_norm_samples()


@pytest.mark.autograd_op(op=rms_norm_op, reference=rms_norm_with_rstd_reference, double_backward=False, **NATIVE)
def test_triton_rms_norm_custom_op_passes_every_default_check():
    return rms_norm_samples()


TRITON_OP = pytest.mark.skipif(rms_norm_triton_op is None, reason=f"torch {torch.__version__} has no "
                                                                  "torch.library.triton_op (added in 2.6)")


@TRITON_OP
@pytest.mark.autograd_op(op=rms_norm_triton_op, reference=rms_norm_with_rstd_reference, double_backward=False,
                         **NATIVE)
def test_triton_rms_norm_triton_op_passes_every_default_check():
    return rms_norm_samples()


@TRITON_OP
def test_a_triton_op_passes_opcheck_and_compile_where_they_can_run(pytester, run_pytest):
    pytester.makepyfile(test_op="""
import pytest
from reference_ops.triton_ops import rms_norm_triton_op, rms_norm_with_rstd_reference, rms_norm_samples

@pytest.mark.autograd_op(op=rms_norm_triton_op, reference=rms_norm_with_rstd_reference, double_backward=False,
                         checks=["opcheck", "compile"])
def test_rms_norm():
    return rms_norm_samples()[:1]
""")
    result = run_pytest(f"--autograd-devices={KERNEL_DEVICE}", "-rs")
    assert "failed" not in result.parseoutcomes(), result.stdout.str()
    if interpreter_on():  # fake-tensor tracing reaches into the interpreted kernel: noted and skipped, not failed
        result.assert_outcomes(passed=1, skipped=1)  # torch's own FakeTensor warning shows once per process
        assert result.stdout.str().count("AutogradNote: sample 0: test_") == 2, result.stdout.str()
        result.stdout.fnmatch_lines(["*test_faketensor not judged: TRITON_INTERPRET=1: Triton's interpreter runs "
                                     "kernels on real memory*",
                                     "SKIPPED [[]1[]] test_op.py:*: TRITON_INTERPRET=1: Triton's interpreter runs "
                                     "kernels on real memory*"])
    else:  # a GPU compiles the kernels: every part of opcheck and torch.compile judges the op
        result.assert_outcomes(passed=2)


@TRITON_OP
def test_a_triton_op_with_a_missing_rstd_term_fails_gradcheck(pytester, run_pytest):
    pytester.makepyfile(test_planted=PLANTED.format(op="rms_norm_triton_op_no_rstd_term", checks=["gradcheck"]))
    result = run_pytest(f"--autograd-devices={KERNEL_DEVICE}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gradient of * w.r.t. `x` does not match the numerical derivative*"])


@pytest.mark.autograd_op(op=TritonRMSNorm, reference=rms_norm_reference, checks=["bench"], sweep=[1024, 8192],
                         **NATIVE)
def test_triton_rms_norm_timings_against_plain_torch(rows=5):
    """Opt-in (--autograd-bench), on a GPU: the kernels against plain torch at a model's width, 4096."""
    return [(torch.randn(rows, 4096), torch.randn(4096) + 1.0)]


def test_the_samples_leave_tails_for_the_row_blocks_and_the_column_masks():
    for sample in rms_norm_samples():
        rows = sample[0].numel() // sample[0].shape[-1]
        width = sample[0].shape[-1]
        assert rows % ROWS_PER_PROGRAM or rows < ROWS_PER_PROGRAM, "a row count the backward blocks divide"
        assert width & (width - 1), "a power-of-two width leaves BLOCK_N's mask untested"
    assert any(s[0].numel() // s[0].shape[-1] > ROWS_PER_PROGRAM for s in rms_norm_samples())


PLANTED = """
import pytest
from reference_ops.triton_ops import {op}, rms_norm_reference, rms_norm_samples

@pytest.mark.autograd_op(op={op}, reference=rms_norm_reference, double_backward=False, checks={checks!r})
def test_rms_norm():
    return rms_norm_samples()
"""


def test_a_missing_rstd_term_in_dx_fails_gradcheck_naming_x(pytester, run_pytest):
    pytester.makepyfile(test_planted=PLANTED.format(op="TritonRMSNormNoRstdTerm", checks=["gradcheck"]))
    result = run_pytest(f"--autograd-devices={KERNEL_DEVICE}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*gradient of output w.r.t. `x` does not match the numerical derivative*",
        "*check gradcheck, device*, dtype float64, sample 0*",
        "*worst element: d output*/ d x*",
    ])
    assert "Traceback" not in result.stdout.str()


def test_a_weight_gradient_reduced_over_one_program_block_only_fails_gradcheck_naming_weight(pytester, run_pytest):
    pytester.makepyfile(test_planted=PLANTED.format(op="TritonRMSNormLastBlockWeightGrad",
                                                    checks=["gradcheck", "reference"]))
    result = run_pytest(f"--autograd-devices={KERNEL_DEVICE}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*gradient of output w.r.t. `weight` does not match the numerical derivative*",
        "*check gradcheck, device*, dtype float64, sample 0*",
    ])
    result.stdout.fnmatch_lines(["*check reference*", "*argument: weight*"])


@pytest.mark.skipif(not interpreter_on(), reason="only the interpreter runs Triton kernels on CPU tensors")
def test_a_cpu_tensor_outside_the_interpreter_gets_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    x = torch.randn(3, 5)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 in the environment before triton is imported"):
        TritonRMSNorm.apply(x, torch.ones(5))
