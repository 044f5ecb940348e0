"""A failure comes with the smallest sample that still fails the same way, and a script that reproduces it alone."""

import json
import re
import subprocess
import sys

import pytest
import torch

from pytest_autograd import Sample, run_checks
from pytest_autograd.engine.case import build_case
from pytest_autograd.engine.repro import write_repro
from pytest_autograd.engine.shrink import same_failure, targets
from pytest_autograd.results.report import Hint, Report

LINEAR = """
import pytest, torch
from reference_ops.buggy import LinearWeightGradTransposed

@pytest.mark.autograd_op(op=LinearWeightGradTransposed, reference=torch.nn.functional.linear)
def test_linear():
    return [(torch.randn(24, 40), torch.randn(16, 40), torch.randn(16))]
"""


# Tests that assert what shrinking finds give it room, so a busy machine cannot cut it short.
ROOMY = "--autograd-shrink=120"


def shrunk_shapes(text):
    """{name: shape} of the first "shrunk: reproduces at ..." line."""
    line = re.search(r"shrunk: reproduces at (.*?) instead of", text).group(1)
    return {name: tuple(int(n) for n in shape.strip("(,)").split(",") if n.strip())
            for name, shape in re.findall(r"(\w+): (\([^)]*\))", line)}


def test_a_failing_sample_is_shrunk_and_the_report_shows_both_shapes(pytester, run_pytest):
    pytester.makepyfile(test_ops=LINEAR)
    result = run_pytest("--autograd-checks=gradcheck", ROOMY)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  rerun: *",
        "  shrunk: reproduces at input: (*), weight: (*), bias: (*) instead of input: (24, 40), weight: (16, 40), "
        "bias: (16,)",
        "    values there: *",
        "    worst element there: d output[[]*] / d weight[[]*]: expected * (numerical), got * (analytical)",
    ], consecutive=True)
    shapes = shrunk_shapes(result.stdout.str())
    assert all(size <= 3 for shape in shapes.values() for size in shape), shapes
    # A transposed weight gradient needs two input features; it is invisible for a single one.
    assert shapes["input"][1] == shapes["weight"][1] == 2 and shapes["bias"][0] == shapes["weight"][0]


def test_shrinking_keeps_sizes_that_arguments_share_consistent(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest, torch

class MatmulWrongSecondGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad @ b.T, 2 * a.T @ grad  # BUG: b's gradient doubled

@pytest.mark.autograd_op(op=MatmulWrongSecondGrad)
def test_matmul():
    return [(torch.randn(6, 20), torch.randn(20, 9))]
""")
    result = run_pytest("--autograd-checks=gradcheck", ROOMY)
    result.assert_outcomes(failed=1)
    shapes = shrunk_shapes(result.stdout.str())
    assert shapes["a"][1] == shapes["b"][0], shapes  # the inner dimension, shared, shrank as one
    assert max(size for shape in shapes.values() for size in shape) <= 2, shapes
    result.stdout.fnmatch_lines(["  hint: the analytical gradient is twice the numerical one at every element of `b`*"])


def test_shrinking_is_off_with_zero_seconds_from_the_option_or_the_ini_file(pytester, run_pytest):
    pytester.makepyfile(test_ops=LINEAR)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-shrink=0")
    result.assert_outcomes(failed=1)
    assert "shrunk:" not in result.stdout.str()
    pytester.makeini("[pytest]\nautograd_shrink = 0\n")
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    assert "shrunk:" not in result.stdout.str()


def test_a_shrink_budget_that_is_not_a_number_is_a_usage_error(pytester, run_pytest):
    pytester.makepyfile(test_ops=LINEAR)
    result = run_pytest("--autograd-shrink=soon")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--autograd-shrink: 'soon' is not a number of seconds; pass e.g. "
                                 "--autograd-shrink=10*or 0 to report failing samples unshrunk*"])


def test_a_bug_that_needs_a_large_sample_is_reported_at_its_original_size(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest, torch

class DoubleWhenLarge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * (6 if grad.numel() >= 64 else 3)  # BUG only from 64 elements on

@pytest.mark.autograd_op(op=DoubleWhenLarge)
def test_op():
    return [(torch.randn(8, 8),)]
""")
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of output w.r.t. `x` does not match the numerical derivative"])
    # Nothing smaller fails: the original size stands (its values may still get simpler).
    assert "instead of" not in result.stdout.str()
    shrunk = [line for line in result.stdout.lines if "shrunk:" in line]
    assert shrunk in ([], ["  shrunk: reproduces at the same sizes, simpler values"])


def test_a_spent_budget_never_turns_the_failure_into_a_pass(pytester, run_pytest):
    pytester.makepyfile(test_ops=LINEAR)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-shrink=0.000001")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient of all outputs w.r.t. `weight` does not match the numerical derivative",
                                 "*worst element: grad weight[[]*]*"])
    assert "shrunk:" not in result.stdout.str()


def test_a_candidate_failing_another_way_is_not_the_same_failure():
    original = Report("gradcheck", "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
                      dtype="float64", output="all outputs", argument="x", worst="w", error="abs error 3 > 1")
    smaller = Report("gradcheck", "gradient of output w.r.t. `x` does not match the numerical derivative",
                     dtype="float64", output="output", argument="x", worst="w", error="abs error 1 > 0.1")
    assert same_failure(original, smaller)  # a cotangent over all outputs, or one output: the same argument
    other_argument = Report("gradcheck", smaller.summary.replace("`x`", "`w`"), dtype="float64", output="output",
                            argument="w", worst="w", error="e")
    assert not same_failure(original, other_argument)
    other_argument.also = [{"argument": "x", "output": "output", "worst": "w", "locus": None}]
    assert same_failure(original, other_argument)  # x is still wrong, only no longer the worst
    other_kind = Report("gradcheck", smaller.summary, dtype="float64", output="output", argument="x", worst="w",
                        error="e", hint="backward returns no gradient (None or zeros) for `x`")
    assert not same_failure(original, other_kind)
    other_dtype = Report("gradcheck", smaller.summary, dtype="float32", output="output", argument="x", worst="w",
                         error="e")
    assert not same_failure(original, other_dtype)


@pytest.mark.parametrize("planted, hint", [
    ("LinearWeightGradLastColumnTwice", "the analytical gradient is wrong only in column 39 of `weight`: twice the "
                                        "numerical one there *"),
    ("LinearGradInputFirstRowTwice", "the analytical gradient is wrong only in row 0 of `input`: twice the numerical "
                                     "one there *"),
])
def test_a_failure_confined_to_one_column_or_row_shrinks_like_any_other(pytester, run_pytest, planted, hint):
    # Its hint names the column: a smaller sample has it at another index (the last column's), or as the only
    # element left, or as the whole argument; it is still the same failure.
    pytester.makepyfile(test_ops=LINEAR.replace("LinearWeightGradTransposed", planted))
    result = run_pytest("--autograd-checks=gradcheck", ROOMY)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"  hint: {hint}"])
    shapes = shrunk_shapes(result.stdout.str())
    assert all(size == 1 for shape in shapes.values() for size in shape), shapes


def test_a_hint_is_told_by_what_it_blames_not_by_where_it_shows():
    summary = "gradient of output w.r.t. `x` does not match the numerical derivative"

    def failing(hint):
        return Report("gradcheck", summary, dtype="float64", output="output", argument="x", worst="w", error="e",
                      hint=hint)

    column = failing(Hint("the analytical gradient is wrong only in column 5 of `x`: twice the numerical one there",
                          cause="twice", confined=True))
    for smaller in ("only in column 2 of `x`: twice the numerical one there", "wrong only at grad x[0, 2] (twice ...)",
                    "twice the numerical one at every element of `x`"):
        assert same_failure(column, failing(Hint(smaller, cause="twice", confined="every" not in smaller)))
    assert not same_failure(column, failing(Hint("three times the numerical one", cause="three times")))
    assert not same_failure(column, failing("backward returns no gradient (None or zeros) for `x`"))
    everywhere = failing(Hint("twice the numerical one at every element of `x`", cause="twice", confined=False))
    assert same_failure(everywhere, failing(Hint("twice ... along 3 random directions", cause="twice")))
    # A factor at every element, confined to a column of a smaller sample: another bug than the original's.
    assert not same_failure(everywhere, failing(Hint("only in column 2 of `x`: twice", cause="twice", confined=True)))


def test_sizes_to_try_start_small():
    assert targets(2) == [1]
    assert targets(512) == [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
    assert targets(40) == [1, 2, 3, 4, 8, 16, 20, 32]


def run_script(path, cwd):
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_repro_script_runs_in_a_fresh_interpreter_and_shows_the_reports_numbers(pytester, run_pytest, tmp_path):
    pytester.makepyfile(test_ops=LINEAR)
    result = run_pytest("--autograd-checks=gradcheck,reference", "--autograd-repro=repro", ROOMY)
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    result.stdout.fnmatch_lines(["  repro: python repro/test_ops.py-test_linear-gradcheck-cpu.py",
                                 "  repro: python repro/test_ops.py-test_linear-reference-cpu.py"])
    gradcheck = re.search(r"worst element there: (.*): expected (\S+) \(numerical\), got (\S+) \(analytical\)", text)
    done = run_script(pytester.path / "repro" / "test_ops.py-test_linear-gradcheck-cpu.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[:3] == [
        gradcheck.group(1),
        f"  numerical derivative (float64 central difference, eps 1e-06): {gradcheck.group(2)}",
        f"  analytical derivative (autograd through the op's backward): {gradcheck.group(3)}",
    ]
    assert "the bug is still there" in done.stdout
    reference = re.search(r"worst element there: grad (\w+)\[(.*)\]: expected (\S+), got (\S+)", text)
    done = run_script(pytester.path / "repro" / "test_ops.py-test_linear-reference-cpu.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[:3] == [f"grad {reference.group(1)}[{reference.group(2)}] in float64",
                                            f"  the reference: {reference.group(3)}",
                                            f"  the op: {reference.group(4)}"]
    script = (pytester.path / "repro" / "test_ops.py-test_linear-gradcheck-cpu.py").read_text()
    assert "pytest" not in script.split('"""', 2)[2] and "pytest_autograd" not in script
    assert "import reference_ops.buggy" in script


def test_the_repro_script_of_a_correct_op_exits_0(tmp_path):
    # The script of a failure, run against the fixed op, says so: swap the op in the written script.
    from reference_ops.buggy import CubeWrongAtOneElement

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    x[-1, -1] = 1.5  # the wrong element's gradient is off by 3 x**2: a random x near 0 would hide it
    outcomes = run_checks(CubeWrongAtOneElement, x, checks=["gradcheck"], repro=tmp_path)
    script = tmp_path / "CubeWrongAtOneElement-gradcheck-cpu.py"
    assert outcomes[0].status == "failed" and f"repro: python {script}" in outcomes[0].detail
    assert run_script(script, tmp_path).returncode == 1
    script.write_text(script.read_text().replace("reference_ops.buggy.CubeWrongAtOneElement", "reference_ops.Cube"))
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "they agree" in done.stdout


def test_a_second_derivative_and_a_precision_failure_get_scripts_too(tmp_path):
    from reference_ops.known_patterns import GeluSavesCdf

    (outcome,) = run_checks(GeluSavesCdf, torch.randn(4, 5), checks=["gradgradcheck"], repro=tmp_path, shrink=120)
    numbers = re.search(r"worst element there: (.*): expected (\S+) \(numerical\), got (\S+)", outcome.detail)
    done = run_script(tmp_path / "GeluSavesCdf-gradgradcheck-cpu.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[1:3] == [
        f"  numerical second derivative (float64 central difference, eps 1e-06): {numbers.group(2)}",
        f"  analytical second derivative (autograd through the op's backward): {numbers.group(3)}"]

    from reference_ops.buggy import LinearFloat32Backward

    outcomes = run_checks(LinearFloat32Backward, torch.randn(4, 6), torch.randn(3, 6), torch.randn(3),
                          checks=["precision"], precision_tol=1e-9, shrink=0, repro=tmp_path)
    if outcomes[0].status != "failed":
        pytest.skip(f"precision did not fail here: {outcomes[0].detail}")
    done = run_script(tmp_path / "LinearFloat32Backward-precision-cpu.py", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "over budget: the bug is still there" in done.stdout


def test_an_op_a_script_cannot_import_gets_a_note_saying_what_to_paste(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
import pytest, torch

@pytest.mark.autograd_op(op=lambda x: x * 2, reference=lambda x: x * 3, checks=["reference"])
def test_scale():
    return [(torch.randn(2, 3),)]
""")
    result = run_pytest("--autograd-repro=repro")
    result.assert_outcomes(failed=1)
    script = pytester.path / "repro" / "test_ops.py-test_scale-reference-cpu.py"
    text = script.read_text()
    assert "# `op` is a lambda (defined at " in text and "paste its definition here" in text
    assert "#     @pytest.mark.autograd_op(op=lambda x: x * 2, reference=lambda x: x * 3" in text
    done = run_script(script, pytester.path)
    assert done.returncode == 2 and "paste the definition of `op`" in done.stderr


def test_the_json_record_carries_the_shrunk_shapes_and_the_script(pytester, run_pytest):
    pytester.makepyfile(test_ops=LINEAR)
    run_pytest("--autograd-checks=gradcheck", "--autograd-repro=repro", "--autograd-json=record.json", ROOMY)
    (record,) = json.loads((pytester.path / "record.json").read_text())["records"]
    failure = record["failure"]
    assert failure["shrunk"]["original"] == {"input": [24, 40], "weight": [16, 40], "bias": [16]}
    assert set(failure["shrunk"]["shapes"]) == {"input", "weight", "bias"}
    assert failure["shrunk"]["complete"] is True and failure["shrunk"]["seconds"] >= 0
    assert failure["repro"] == "repro/test_ops.py-test_linear-gradcheck-cpu.py"


def test_run_checks_shrinks_too_and_keeps_the_shrinking_runs_notes_out(tmp_path):
    from reference_ops.buggy import LinearGradInputWrong

    sample = Sample(torch.randn(9, 12), torch.randn(7, 12), torch.randn(7))
    (outcome,) = run_checks(LinearGradInputWrong, samples=sample, checks=["gradcheck"], shrink=120)
    assert outcome.report.shrunk is not None and "shrunk: reproduces at input: " in outcome.detail
    assert outcome.report.shrunk["original"]["input"] == [9, 12]
    (unshrunk,) = run_checks(LinearGradInputWrong, samples=sample, checks=["gradcheck"], shrink=0)
    assert unshrunk.report.shrunk is None


def test_a_parity_script_compares_the_op_on_two_devices(tmp_path):
    # No GPU needed to check the script's parity path: the same op on the CPU twice agrees with itself.
    from reference_ops.buggy import LinearWeightGradTransposed

    sample = (torch.randn(2, 3), torch.randn(4, 3), torch.randn(4))
    (outcome,) = run_checks(LinearWeightGradTransposed, *sample, reference=torch.nn.functional.linear,
                            checks=["reference"], shrink=0)
    locus = dict(outcome.report.locus, expected_fn=("op", "op"), devices=("cpu", "cpu"),
                 expected_label="cpu", got_label="cpu")
    case = build_case({"op": LinearWeightGradTransposed}, [Sample(*sample)])
    script, why_not = write_repro(tmp_path, "parity", case, case.samples[0], locus, outcome.report, "cpu", "parity")
    assert why_not is None
    done = run_script(script, tmp_path)
    assert done.returncode == 0 and "they agree" in done.stdout, done.stdout + done.stderr


def test_a_module_op_is_pickled_beside_its_script(tmp_path):
    from reference_ops.modules import FunctionLinearWeightGradTransposed

    (outcome,) = run_checks(FunctionLinearWeightGradTransposed(6, 5), torch.randn(4, 6), checks=["gradcheck"],
                            repro=tmp_path, shrink=120)
    numbers = re.search(r"worst element there: (.*): expected (\S+) \(numerical\), got (\S+)", outcome.detail)
    script = tmp_path / "FunctionLinearWeightGradTransposed-gradcheck-cpu.py"
    assert script.with_suffix(".modules.pt").is_file()
    done = run_script(script, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == numbers.group(1) and f": {numbers.group(3)}" in done.stdout.splitlines()[2]


def test_a_shrunk_sizes_failure_names_the_size_that_fails_there_not_only_the_shrunk_sample():
    # The shrunk sample of a sizes failure may be right itself (8 rows, a multiple of the block): the report must
    # say at which size it is wrong, or a reader runs the op on the shrunk sample and sees no bug.
    import torch

    from pytest_autograd import run_checks
    from reference_ops.sizes import TiledSoftmaxGridFloor, softmax_reference

    outcome, = run_checks(TiledSoftmaxGridFloor, torch.randn(8, 256), reference=softmax_reference, checks=["sizes"])
    assert outcome.status == "failed"
    lines = outcome.detail.splitlines()
    shrunk = next(i for i, line in enumerate(lines) if line.startswith("  shrunk: reproduces at x: ("))
    assert lines[shrunk + 1].startswith("    there: gradient w.r.t. `x` is wrong when dim 0 (size "), lines[shrunk + 1]
    assert "in your sample) is " in lines[shrunk + 1]
