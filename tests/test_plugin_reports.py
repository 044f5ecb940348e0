"""A failure reads top to bottom: what is wrong, where, by how much, and how to rerun it."""

OPS = """
import pytest
import torch

class MulWrongWhenBatched(torch.autograd.Function):
    \"\"\"a * b; the gradient for `b` is doubled on 2-D inputs only.\"\"\"

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        factor = 2.0 if a.dim() == 2 else 1.0
        return grad * b, grad * a * factor

def mul_reference(a, b):
    return a * b

def halves_reference(x):
    return x[:2] * 2, x[2:] * 3

def halves_with_offset(x):
    return x[:2] * 2, x[2:] * 3 + 0.5

SAMPLES = [
    (torch.tensor([1.0, -2.0, 0.5, 3.0]), torch.tensor([0.5, 1.5, -1.0, 2.0])),
    (torch.tensor([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]]), torch.tensor([[2.0, 1.0, -1.0], [0.5, -0.5, 4.0]])),
]

@pytest.mark.autograd_op(op=MulWrongWhenBatched, reference=mul_reference)
def test_mul():
    return SAMPLES

@pytest.mark.autograd_op(op=halves_with_offset, reference=halves_reference)
def test_halves():
    return [(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),)]
"""


def test_gradcheck_report_names_check_device_dtype_sample_argument_and_worst_element(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-seed=3", "-k", "test_mul")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `b` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 1",
        "  output: output, argument: b",
        "  worst element: d output[[]*] / d b[[]*]: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (full Jacobian)",
        "  hint: the analytical gradient is twice the numerical one at every element of `b`: a constant factor is off",
        "  seed: *",
        '  rerun: pytest "test_ops.py::test_mul[[]gradcheck-cpu[]]" --autograd-seed=3',
    ], consecutive=True)


def test_reference_report_shows_expected_and_got_with_tolerances(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=reference", "-k", "test_mul")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `b` from the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 1",
        "  argument: b",
        "  worst element: grad b[[]*]: expected *, got *",
        "  max abs error *, max rel error 1 (atol *, rtol 1e-07); 6 of 6 elements differ",
        "  seed: *",
        '  rerun: pytest "test_ops.py::test_mul[[]reference-cpu[]]" --autograd-seed=0',
    ], consecutive=True)


def test_a_forward_mismatch_names_which_output_of_several(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=reference", "-k", "test_halves")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output 1 of the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "  output: output 1",
        "  worst element: output 1[[]*]: expected *, got *",
        "  max abs error 0.5, max rel error * (atol *, rtol 1e-07); 3 of 3 elements differ",
        "  seed: *",
    ], consecutive=True)


def test_the_report_is_shown_without_a_python_traceback(pytester, run_pytest):
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=gradcheck,reference")
    result.assert_outcomes(failed=3, passed=1)
    text = result.stdout.str()
    assert "Traceback" not in text
    assert "pytest_autograd/" not in text
    assert "def run(" not in text
