"""A Triton kernel written apart from this project (a fused tanh-GELU) is judged right by the plugin.

The test file below is what a kernel author writes: ``@triton.jit`` kernels,
an autograd.Function launching them, the marker. It shares nothing with
``reference_ops``. Under the interpreter it runs on CPU tensors; on a GPU,
natively, on CUDA (where parity has no CPU run to compare against).
"""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install -e '.[triton]' installs it")

from pytest_autograd.engine.triton_interpreter import interpreter_on  # noqa: E402

if not interpreter_on() and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1 set before triton is imported",
                allow_module_level=True)

KERNEL_DEVICE = "cpu" if interpreter_on() else "cuda"

GELU_TEST = '''
import os
import pytest
import torch
import triton
import triton.language as tl

SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # compiled kernels read only constexpr globals
BLOCK = 16  # does not divide the sample sizes: the last program is masked


@triton.jit
def gelu_forward_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)  # computes in the input's dtype (float64 too)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    t = 2.0 * tl.sigmoid(2.0 * u) - 1.0  # tanh(u)
    tl.store(y_ptr + offsets, 0.5 * x * (1.0 + t), mask=mask)


@triton.jit
def gelu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr, CUBIC_TERM: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
    if CUBIC_TERM:
        du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
    else:
        du = SQRT_2_OVER_PI * 1.0  # the derivative of the cubic term is forgotten
    dx = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
    tl.store(dx_ptr + offsets, dy * dx, mask=mask)


class TritonGELU(torch.autograd.Function):
    cubic_term = True

    @staticmethod
    def forward(ctx, x):
        flat = x.contiguous().view(-1)
        y = torch.empty_like(flat)
        gelu_forward_kernel[(triton.cdiv(flat.numel(), BLOCK),)](flat, y, flat.numel(), BLOCK=BLOCK)
        ctx.save_for_backward(x)
        return y.view(x.shape)

    @classmethod
    def backward(cls, ctx, grad_y):
        (x,) = ctx.saved_tensors
        flat = x.contiguous().view(-1)
        dx = torch.empty_like(flat)
        gelu_backward_kernel[(triton.cdiv(flat.numel(), BLOCK),)](
            grad_y.contiguous().view(-1), flat, dx, flat.numel(), BLOCK=BLOCK, CUBIC_TERM=cls.cubic_term)
        return dx.view(x.shape)


class TritonGELUWithoutCubicTerm(TritonGELU):
    cubic_term = False


def gelu(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


# Natively the kernels take CUDA tensors only: no CPU run, so no parity against CPU.
NATIVE = {} if os.environ.get("TRITON_INTERPRET") == "1" else {"devices": ["cuda"], "skip": ["parity"]}


@pytest.mark.autograd_op(op=TritonGELU, reference=gelu, double_backward=False, **NATIVE)
def test_gelu():
    return [(torch.randn(37),), (torch.randn(3, 7),)]


@pytest.mark.autograd_op(op=TritonGELUWithoutCubicTerm, reference=gelu, double_backward=False,
                         checks=["gradcheck", "reference"], **NATIVE)
def test_gelu_without_cubic_term():
    return [(torch.randn(37),), (torch.randn(3, 7),)]
'''


def test_an_independently_written_triton_gelu_passes_every_default_check(pytester, run_pytest):
    pytester.makepyfile(test_gelu=GELU_TEST)
    result = run_pytest("test_gelu.py::test_gelu", f"--autograd-devices={KERNEL_DEVICE}", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 10 and "failed" not in outcomes and "error" not in outcomes, result.stdout.str()
    result.stdout.fnmatch_lines(["gradcheck *1 passed", "reference *1 passed", "precision *1 passed"])


def test_its_backward_without_the_cubic_term_fails_gradcheck_and_reference(pytester, run_pytest):
    pytester.makepyfile(test_gelu=GELU_TEST)
    result = run_pytest("test_gelu.py::test_gelu_without_cubic_term", f"--autograd-devices={KERNEL_DEVICE}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*gradient of output w.r.t. `x` does not match the numerical derivative*",
        "*check gradcheck, device*, dtype float64, sample 0*",
    ])
    result.stdout.fnmatch_lines(["*check reference, device*", "*argument: x*"])
    assert "Traceback" not in result.stdout.str()
