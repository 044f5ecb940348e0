"""Failures and skips whose cause has a known shape say what it is and what to change."""

HEADER = """
import pytest
import torch
from reference_ops import Cube, LinearFunction, linear_samples
from reference_ops.known_patterns import *
"""


def run(pytester, run_pytest, body, *args):
    pytester.makepyfile(test_ops=HEADER + body)
    return run_pytest("-rs", *args)


def test_a_nan_second_derivative_from_sqrt_of_a_saved_output_names_the_pattern(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=SquareSqrtOfSavedOutput)
def test_square():
    return square_samples()
""", "--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "second derivative of grad x w.r.t. `x` does not match the numerical one",
        "*worst element: * expected * (numerical), got nan (analytical)",
        "*hint: the second derivative is NaN/inf where the numerical one is finite: backward likely applies sqrt, "
        "pow or log to a saved value that is 0 there*torch.where gradient trap*",
    ])


def test_the_square_written_with_the_saved_input_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=Square, reference=lambda x: x * x)
def test_square():
    return square_samples()
""")
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()


def test_a_backward_without_double_backward_gets_the_double_backward_false_hint(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=SquareNoDoubleBackward)
def test_square():
    return square_samples()
""", "--autograd-checks=gradgradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's backward raised RuntimeError while taking the second derivative: double backwards on square "
        "not supported",
        "*hint: the op's backward cannot itself be differentiated (its kernel has no double backward): declare it "
        "with double_backward=False on the marker*",
    ])


def test_declared_without_double_backward_it_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=SquareNoDoubleBackward, reference=lambda x: x * x, double_backward=False)
def test_square():
    return square_samples()
""")
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED * double_backward=False on the marker declares that the op has no second "
                                 "derivative"])


def test_ctc_loss_refusing_double_backward_gets_the_same_hint(pytester, run_pytest):
    result = run(pytester, run_pytest, """
import torch.nn.functional as F

def ctc(log_probs):
    targets = torch.tensor([[1, 2]])
    return F.ctc_loss(log_probs.log_softmax(-1), targets, torch.tensor([4]), torch.tensor([2]))

@pytest.mark.autograd_op(op=ctc)
def test_ctc():
    return [(torch.randn(4, 1, 3),)]
""", "--autograd-checks=gradgradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hint: the op's backward cannot itself be differentiated*double_backward=False*"])


def test_the_leak_hint_does_not_suggest_save_for_backward_for_a_tensor_already_saved_that_way(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=CubeCachesInput)
def test_cube():
    return [(torch.randn(3),)]
""", "--autograd-checks=leak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*hint: `x` is already saved with ctx.save_for_backward, so something else holds it: a global list or "
        "cache, a closure*",
    ])
    assert "use ctx.save_for_backward" not in result.stdout.str()


def test_aten_ops_name_arguments_as_their_schema_does(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=torch.ops.aten.mul, reference=lambda a, b: a * b.detach())
def test_mul():
    return [(torch.randn(3), torch.randn(3))]
""", "--autograd-checks=reference")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `other` from the op differs from the reference",
                                 "  check reference, device cpu, dtype float64, sample 0",
                                 "  argument: other"], consecutive=True)
    assert "arg1" not in result.stdout.str()


def test_constants_naming_aten_schema_arguments_are_accepted(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=torch.ops.aten.addmm, constants=("self",))
def test_addmm():
    return [(torch.randn(2, 4), torch.randn(2, 3), torch.randn(3, 4))]
""", "--autograd-checks=gradcheck")
    result.assert_outcomes(passed=1)


def test_requires_grad_judges_the_inference_path_when_constants_leave_one_differentiable_input(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=LinearFunction, constants=("weight", "bias"))
def test_linear():
    return linear_samples()
""", "--autograd-checks=requires_grad")
    result.assert_outcomes(passed=1)


SAVED_INTERMEDIATE = ("*hint: forward computed and saved ctx.saved_tensors[[]{index}[]] of {op} (shape (3, 4)), which has "
                      "no graph (forward runs without one), so double backward treats it as a constant and loses its "
                      "dependence on `x`: holding every such saved tensor fixed gives exactly the analytical second "
                      "derivative. Recompute it inside backward from the saved inputs*")


def test_an_intermediate_saved_in_forward_is_named_as_the_cause_of_a_wrong_second_derivative(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=GeluSavesCdf)
def test_gelu():
    return [(torch.randn(3, 4),)]

@pytest.mark.autograd_op(op=TanhSavesSlope)
def test_tanh():
    return [(torch.randn(3, 4),)]
""", "--autograd-checks=gradcheck,gradgradcheck", "--autograd-shrink=0")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "second derivative of grad x w.r.t. `x` does not match the numerical one",
        "*",
        "*",
        "*",
        "*",
        SAVED_INTERMEDIATE.format(index=1, op="GeluSavesCdf"),
    ])
    result.stdout.fnmatch_lines([
        "backward is not differentiable w.r.t. `x`: the analytical second derivative is all zeros while the numerical "
        "one is not",
        "*",
        "*",
        "*",
        "*",
        SAVED_INTERMEDIATE.format(index=0, op="TanhSavesSlope"),
    ])


def test_the_twins_that_recompute_or_save_the_output_pass_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=Gelu, reference=torch.nn.functional.gelu)
def test_gelu():
    return [(torch.randn(3, 4),)]

@pytest.mark.autograd_op(op=TanhSavesOutput, reference=torch.tanh)
def test_tanh():
    return [(torch.randn(3, 4),)]
""")
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()


def test_a_saved_intermediate_that_explains_nothing_is_not_blamed(pytester, run_pytest):
    result = run(pytester, run_pytest, """
@pytest.mark.autograd_op(op=CubeHalfSecondDerivativeSavesUnused)
def test_cube():
    return [(torch.randn(3, 4),)]
""", "--autograd-checks=gradgradcheck", "--autograd-shrink=0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hint: the backward's own gradient is wrong: check the ops backward uses on saved "
                                 "tensors"])
    assert "forward computed and saved" not in result.stdout.str()


def test_a_gradient_wrong_in_one_column_or_row_says_so_and_its_twin_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, """
from reference_ops.buggy import LinearGradInputFirstRowTwice, LinearWeightGradLastColumnTwice

@pytest.mark.autograd_op(op=LinearWeightGradLastColumnTwice, checks=["gradcheck"])
def test_column():
    return linear_samples()

@pytest.mark.autograd_op(op=LinearGradInputFirstRowTwice, checks=["gradcheck"])
def test_row():
    return linear_samples()

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_twin():
    return linear_samples()
""", "--autograd-shrink=0")
    assert result.parseoutcomes()["failed"] == 2, result.stdout.str()
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `weight` does not match the numerical derivative",
        "*",
        "*",
        "  worst element: d output[[]*] / d weight[[]*, 3]: *",
        "*",
        "  hint: the analytical gradient is wrong only in column 3 of `weight`: twice the numerical one there, right "
        "at every other element: an index, stride or bound that treats this slice apart (a special-cased first or "
        "last row or column, a remainder block, a tile's edge), not the formula",
    ], consecutive=True)
    result.stdout.fnmatch_lines([
        "gradient of output w.r.t. `input` does not match the numerical derivative",
        "*",
        "*",
        "  worst element: d output[[]*] / d input[[]0, *]: *",
        "*",
        "  hint: the analytical gradient is wrong only in row 0 of `input`: twice the numerical one there, right at "
        "every other element: *",
    ], consecutive=True)
    assert "every element of" not in result.stdout.str()
    failed = [line for line in result.stdout.lines if line.startswith("FAILED ")]
    assert all("test_twin" not in line for line in failed), failed
