"""reference: an op more precise than its reference is not blamed for the reference's rounding.

Both are judged against the reference in float64 on the same rounded
inputs; the farther one is blamed. A two-pass variance against the textbook
E[x^2] - E[x]^2 passes in float32 with a note; a wrong op still fails.
"""

HEADER = """
import pytest
import torch
from reference_ops.variance import *
"""


def run(pytester, run_pytest, op, checks="reference"):
    pytester.makepyfile(test_ops=HEADER + f"""
@pytest.mark.autograd_op(op={op}, reference=textbook_variance_reference)
def test_variance():
    return variance_samples()
""")
    return run_pytest(f"--autograd-checks={checks}", "-rs")


def test_a_precise_op_against_a_textbook_reference_passes_with_a_note_blaming_the_reference(pytester, run_pytest):
    result = run(pytester, run_pytest, "TwoPassVariance")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*AutogradNote: reference: in float32 the reference is less precise than the op (output: reference error *, "
        "op error *, each normwise against the reference in float64 on the same rounded inputs); the op passes",
    ])


def test_in_float32_the_textbook_reference_is_off_by_1e_2_where_the_op_is_right_to_1e_5():
    import torch

    from reference_ops.variance import TwoPassVariance, textbook_variance_reference, variance_samples

    [(x,)] = variance_samples(torch.Generator().manual_seed(0))
    truth = TwoPassVariance.apply(x.double())
    assert (textbook_variance_reference(x).double() - truth).abs().max() > 1e-2
    assert (TwoPassVariance.apply(x).double() - truth).abs().max() < 1e-5


def test_the_precise_op_passes_every_default_check(pytester, run_pytest):
    result = run(pytester, run_pytest, "TwoPassVariance", "gradcheck,gradgradcheck,reference,mutation,requires_grad,"
                 "undefined_grad,noncontiguous,determinism,grad_metadata,leak,precision,extreme")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()


def test_a_wrong_op_against_the_imprecise_reference_still_fails(pytester, run_pytest):
    result = run(pytester, run_pytest, "TwoPassVarianceHalfGradient")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `x` from the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
    ])


def test_a_note_never_fails_a_correct_op_under_warnings_as_errors_and_reaches_the_json_record(pytester, run_pytest):
    import json

    pytester.makepyfile(test_ops=HEADER + """
@pytest.mark.autograd_op(op=TwoPassVariance, reference=textbook_variance_reference)
def test_variance():
    return variance_samples()
""")
    result = run_pytest("--autograd-checks=reference", "-W", "error", "--autograd-json=record.json")
    result.assert_outcomes(passed=1)
    (record,) = json.loads((pytester.path / "record.json").read_text())["records"]
    assert record["outcome"] == "passed"
    assert any("the reference is less precise than the op" in note for note in record["notes"])
