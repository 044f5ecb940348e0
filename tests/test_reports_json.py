"""--autograd-json writes one record per item, the same with and without xdist."""

import json

import pytest

TESTS = """
import pytest, torch
from reference_ops import LinearFunction
from reference_ops.buggy import LinearWeightGradTransposed

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_good():
    return [(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5))]

@pytest.mark.autograd_op(op=LinearWeightGradTransposed, checks=["gradcheck", "parity"])
def test_bad():
    return [(torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))]

@pytest.mark.autograd_op(op=LinearFunction, checks=["gradgradcheck"])
def test_plain():
    return [(torch.randn(2, 3), torch.randn(2, 3), None)]
"""


def records(path):
    document = json.loads(path.read_text())
    assert document["schema"] == "pytest-autograd/record" and document["version"] == 1
    return {record["nodeid"]: record for record in document["records"]}


def run_with_json(pytester, run_pytest, *args):
    pytester.makepyfile(test_ops=TESTS)
    result = run_pytest("--autograd-checks=gradcheck,gradgradcheck,parity,reference",
                        "--autograd-json=out/record.json", *args)
    return result, records(pytester.path / "out" / "record.json")


def test_every_item_gets_a_record_with_its_outcome_seed_and_rerun_command(pytester, run_pytest):
    result, found = run_with_json(pytester, run_pytest)
    result.assert_outcomes(passed=4, failed=1, skipped=2)
    good = found["test_ops.py::test_good[gradcheck-cpu]"]
    assert good["outcome"] == "passed" and good["check"] == "gradcheck" and good["device"] == "cpu"
    assert good["test"] == "test_ops.py::test_good"
    assert isinstance(good["seed"], int) and "test_good[gradcheck-cpu]" in good["rerun"]
    assert good["duration"] > 0 and good["failure"] is None
    skipped = found["test_ops.py::test_good[parity-cpu]"]
    assert skipped["outcome"] == "skipped" and "parity compares a non-CPU device against CPU" in skipped["reason"]
    result.stdout.fnmatch_lines(["*autograd: 7 records written to *record.json"])


def test_a_failure_is_recorded_field_by_field(pytester, run_pytest):
    _, found = run_with_json(pytester, run_pytest)
    failure = found["test_ops.py::test_bad[gradcheck-cpu]"]["failure"]
    assert found["test_ops.py::test_bad[gradcheck-cpu]"]["outcome"] == "failed"
    assert failure["argument"] == "weight" and failure["dtype"] == "float64"
    assert "does not match the numerical derivative" in failure["summary"]
    assert isinstance(failure["expected"], float) and isinstance(failure["got"], float)
    assert failure["expected"] != failure["got"]
    assert failure["abs_error"] > failure["tolerance"] > 0
    assert failure["strategy"] == "full Jacobian"
    assert failure["worst"].startswith("d output[")


def test_xfailed_items_are_recorded_as_xfailed(pytester, run_pytest):
    pytester.makepyfile(test_ops="""
        import pytest, torch
        from reference_ops.buggy import LinearWeightGradTransposed

        @pytest.mark.xfail(reason="weight grad known wrong")
        @pytest.mark.autograd_op(op=LinearWeightGradTransposed, checks=["gradcheck"])
        def test_bad():
            return [(torch.randn(3, 4), torch.randn(4, 4), torch.randn(4))]
    """)
    run_pytest("--autograd-json=record.json").assert_outcomes(xfailed=1)
    (record,) = records(pytester.path / "record.json").values()
    assert record["outcome"] == "xfailed" and record["reason"] == "weight grad known wrong"


def test_xdist_workers_records_reach_one_file(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_ops=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--autograd-checks=gradcheck,gradgradcheck,parity,reference",
                                           "--autograd-json=record.json")
    result.assert_outcomes(passed=4, failed=1, skipped=2)
    found = records(pytester.path / "record.json")
    assert len(found) == 7
    assert found["test_ops.py::test_bad[gradcheck-cpu]"]["failure"]["argument"] == "weight"
    assert all(isinstance(record["seed"], int) for record in found.values() if record["outcome"] != "skipped")


def test_a_records_test_name_drops_only_the_check_and_device_part():
    from pytest_autograd.pytest_adapter.record import test_name

    assert test_name("t.py::test_x[gradcheck-cpu]", "gradcheck-cpu") == "t.py::test_x"
    assert test_name("t.py::test_x[gradcheck-cpu-4]", "gradcheck-cpu") == "t.py::test_x[4]"
    assert test_name("t.py::test_x[a-b-parity-cuda:1]", "parity-cuda:1") == "t.py::test_x[a-b]"
    assert test_name("t.py::test_x", "gradcheck-cpu") == "t.py::test_x"


def test_every_item_has_a_record_including_those_skipped_before_they_run(pytester, run_pytest):
    pytester.makepyfile(test_relu="""
import pytest, torch
from reference_ops import MyReLU

@pytest.mark.autograd_op(op=MyReLU, reference=torch.relu)
def test_relu():
    return [(torch.tensor([-1.0, 0.5, 2.0]),)]
""")
    collected = run_pytest("--collect-only", "-q").outlines
    items = [line for line in collected if "::" in line]
    run_pytest("--autograd-json=record.json")
    records = json.loads((pytester.path / "record.json").read_text())["records"]
    assert sorted(record["nodeid"] for record in records) == sorted(items)
    bench = next(record for record in records if record["check"] == "bench")
    assert bench["outcome"] == "skipped" and "--autograd-bench" in bench["reason"]
