"""run_checks, the engine's entry point, without pytest: a script with pytest unimportable, and unittest."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_autograd"


def run_python(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_engine_runs_a_check_where_pytest_cannot_be_imported():
    script = textwrap.dedent("""
        import sys
        sys.modules["pytest"] = sys.modules["_pytest"] = sys.modules["pluggy"] = None  # import pytest fails
        import torch
        from pytest_autograd import Sample, run_checks
        from reference_ops import LinearFunction
        from reference_ops.buggy import LinearWeightGradTransposed

        x, w, b = torch.randn(5, 3), torch.randn(4, 3), torch.randn(4)
        good = run_checks(LinearFunction, x, w, b, checks=["gradcheck", "reference", "compile"],
                          reference=torch.nn.functional.linear)
        bad = run_checks(LinearWeightGradTransposed, samples=Sample(x, torch.randn(3, 3), torch.randn(3)),
                         checks=["gradcheck"])
        print([(o.check, o.status) for o in good])
        print(bad[0].status, bad[0].detail.splitlines()[0])
    """)
    done = run_python("-c", script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[('gradcheck', 'passed'), ('reference', 'passed'), ('compile', 'passed')]"
    assert lines[1].startswith("failed gradient of output w.r.t. `weight` does not match")


def test_a_unittest_test_case_fails_a_wrong_op_and_passes_its_correct_twin(tmp_path):
    (tmp_path / "test_ops.py").write_text(textwrap.dedent("""
        import unittest
        import torch
        from pytest_autograd import run_checks
        from reference_ops import MyReLU
        from reference_ops.buggy import ReLUPositiveGradOnly

        def failures(op):
            x = torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]])
            return [o.detail for o in run_checks(op, x, reference=torch.relu) if o.status == "failed"]

        class TestReLU(unittest.TestCase):
            def test_correct(self):
                self.assertEqual(failures(MyReLU), [])

            def test_wrong(self):
                self.assertEqual(failures(ReLUPositiveGradOnly), [])
    """))
    done = run_python("-m", "unittest", "-v", "test_ops", cwd=tmp_path)
    assert "test_correct (test_ops.TestReLU" in done.stderr and "ok" in done.stderr
    assert "FAILED (failures=1)" in done.stderr, done.stderr
    assert "w.r.t. `x` does not match the numerical derivative" in done.stderr
