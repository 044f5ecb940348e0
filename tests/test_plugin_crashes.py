"""An op that crashes the interpreter (segfault, abort) in pytest's own process under pytest-xdist
(``--autograd-isolate=off``; by default the crash happens in the sandbox, see test_crash_isolation.py): the item
fails naming the op and the check, the summary counts it, and the rest of the session runs and reports."""

import pytest

CRASHING = """
import ctypes
import pytest, torch
from reference_ops import MyReLU


class ReadsAddressZero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctypes.string_at(0)  # what a kernel reading a null pointer does to the process
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@pytest.mark.autograd_op(op=ReadsAddressZero, checks=["gradcheck"])
def test_crashing_op():
    return [(torch.randn(3),)]


@pytest.mark.autograd_op(op=MyReLU, reference=torch.relu, checks=["gradcheck", "reference"])
def test_relu():
    return [(torch.tensor([-1.0, 0.5, 2.0]),)]
"""


def test_a_crashing_op_fails_its_item_and_the_session_goes_on_under_xdist_without_isolation(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_ops=CRASHING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--junitxml=junit.xml",
                                           "--autograd-isolate=off")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "ReadsAddressZero crashed the Python process during check gradcheck on cpu: a segfault or abort in its "
        "C++/CUDA/Triton code*pytest-xdist started a new worker and the session went on. --autograd-isolate=all runs "
        "every check in a sandbox process*",
        "worker 'gw0' crashed while running 'test_ops.py::test_crashing_op[[]gradcheck-cpu[]]'",
    ])
    result.stdout.fnmatch_lines(["gradcheck * 1 passed 1 failed", "reference * 1 passed",
                                 "*test_ops.py::test_crashing_op  gradcheck-cpu"])
    assert (pytester.path / "junit.xml").read_text().count("<testcase") == 3
