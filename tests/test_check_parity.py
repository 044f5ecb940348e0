"""parity: every non-CPU device agrees with CPU, forward and gradients, integers exactly.

How this is proven on a machine without a GPU:

* ``compare_runs``, where parity's verdict is made, is called directly on
  two runs that differ (a correct op and its planted-bug twin), labelled
  ``cpu`` and ``cuda`` as parity labels them.
* End to end, a test-only *fake device* stands in for CUDA (``FAKE_CUDA``
  below, a conftest for the generated tests): ``cuda`` is declared
  available, and the sample's tensors for the ``cuda`` run are CPU tensors
  of a marker subclass, ``FakeCudaTensor``. A test op checks
  ``isinstance(x, FakeCudaTensor)`` to behave like a kernel with a
  device-only bug. Everything else (item generation, the parity check, the
  comparison, the report, the rerun command) is the real code path.
* On a machine with CUDA the last test runs the same on the real device.
"""

import pytest
import torch

FAKE_CUDA = """
import pytest
import torch

from pytest_autograd.pytest_adapter import items
from pytest_autograd.checks import base
from pytest_autograd.engine.execution import Prepared


class FakeCudaTensor(torch.Tensor):
    \"\"\"A CPU tensor playing a tensor on the 'cuda' device (test-only).\"\"\"


def on_fake_cuda(value):
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().as_subclass(FakeCudaTensor).requires_grad_(value.requires_grad)


@pytest.fixture(autouse=True)
def fake_cuda(monkeypatch):
    real_prepare, real_problem = base.prepare, items.device_problem

    def prepare(case, sample, device, **kwargs):
        if str(device) != "cuda":
            return real_prepare(case, sample, device, **kwargs)
        on_cpu = real_prepare(case, sample, "cpu", **kwargs)
        args = [on_fake_cuda(value) for value in on_cpu.args]
        kwargs = {key: on_fake_cuda(value) for key, value in on_cpu.kwargs.items()}
        leaves = []
        for slot in on_cpu.slots:
            leaves.append(args[slot] if isinstance(slot, int) else kwargs[slot])
        return Prepared(args, kwargs, on_cpu.slots, leaves, on_cpu.names)

    monkeypatch.setattr(base, "prepare", prepare)
    monkeypatch.setattr(items, "device_problem", lambda device: None if device == "cuda" else real_problem(device))
"""

OPS = """
import pytest
import torch
from conftest import FakeCudaTensor
from reference_ops import LinearFunction, SortWithIndices, sort_samples

def on_device(x):
    return isinstance(x, FakeCudaTensor) or x.is_cuda

class LinearGradInputWrongOnDevice(torch.autograd.Function):
    \"\"\"Right on CPU; on the device the input gradient misses the last output feature.\"\"\"

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        return input @ weight.T + bias

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        if on_device(input):
            grad_input = grad[:, :-1] @ weight[:-1]
        else:
            grad_input = grad @ weight
        return grad_input, grad.T @ input, grad.sum(0)

def linear_with_device_offset(input, weight, bias):
    out = LinearFunction.apply(input, weight, bias)
    return out + 1e-3 if on_device(input) else out

def sort_with_shifted_indices_on_device(x):
    values, indices = SortWithIndices.apply(x)
    return values, (indices + 1) % x.shape[-1] if on_device(x) else indices

def linear_samples():
    return [(torch.randn(4, 3), torch.randn(5, 3), torch.randn(5))]

def tf32_enabled():
    matmul = torch.backends.cuda.matmul
    return matmul.fp32_precision == "tf32" if hasattr(matmul, "fp32_precision") else matmul.allow_tf32

def tf32(x):
    # x rounded to TF32's 10-bit mantissa, as a GPU's matmul units read float32 (the gradient passes straight)
    rounded = (x.detach().view(torch.int32) & ~0x1FFF).view(torch.float32)
    return x + (rounded - x).detach()

def linear_in_tf32_where_enabled(input, weight, bias):
    # a matmul as a GPU runs it: in TF32 when torch's switch allows it
    if on_device(input) and tf32_enabled():
        input, weight = tf32(input), tf32(weight)
    return LinearFunction.apply(input, weight, bias)

@pytest.mark.autograd_op(op=linear_in_tf32_where_enabled)
def test_linear_in_tf32():
    return linear_samples()

def linear_kernel_for_the_device_only(input, weight, bias):
    if not on_device(input):
        raise RuntimeError("linear_kernel: CUDA tensors only")
    return LinearFunction.apply(input, weight, bias)

def linear_kernel_raising_everywhere(input, weight, bias):
    raise RuntimeError("linear_kernel: no kernel for this input")

def linear_kernel_for_matrices_only_on_cpu(input, weight, bias):
    if input.shape[0] == 1 and not on_device(input):
        raise RuntimeError("linear_kernel: no CPU kernel for a single row")
    return LinearFunction.apply(input, weight, bias)

class ScaleWithADeviceOnlyBackward(torch.autograd.Function):
    # forward in plain torch, backward a kernel that takes device tensors only
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if not on_device(x):
            raise RuntimeError("scale_backward_kernel: CUDA tensors only")
        return grad * 3

class ScaleWithABackwardRaisingEverywhere(ScaleWithADeviceOnlyBackward):
    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("scale_backward_kernel: no kernel for this input")

@pytest.mark.autograd_op(op=ScaleWithADeviceOnlyBackward)
def test_device_only_backward():
    return [(torch.randn(4, 3),)]

@pytest.mark.autograd_op(op=ScaleWithABackwardRaisingEverywhere)
def test_backward_refused_on_both():
    return [(torch.randn(4, 3),)]

@pytest.mark.autograd_op(op=linear_kernel_for_the_device_only)
def test_device_only_kernel():
    return linear_samples()

@pytest.mark.autograd_op(op=linear_kernel_raising_everywhere)
def test_kernel_raising_everywhere():
    return linear_samples()

@pytest.mark.autograd_op(op=linear_kernel_for_matrices_only_on_cpu)
def test_kernel_refusing_one_row_on_cpu():
    return linear_samples() + [(torch.randn(1, 3), torch.randn(5, 3), torch.randn(5))]

@pytest.mark.autograd_op(op=LinearFunction)
def test_correct_linear():
    return linear_samples()

@pytest.mark.autograd_op(op=SortWithIndices)
def test_correct_sort():
    return sort_samples()

@pytest.mark.autograd_op(op=LinearGradInputWrongOnDevice)
def test_gradient_bug():
    return linear_samples()

@pytest.mark.autograd_op(op=linear_with_device_offset)
def test_forward_bug():
    return linear_samples()

@pytest.mark.autograd_op(op=sort_with_shifted_indices_on_device)
def test_integer_bug():
    return sort_samples()
"""


def run_parity(pytester, run_pytest, *args):
    pytester.makeconftest(FAKE_CUDA)
    pytester.makepyfile(test_ops=OPS)
    return run_pytest("--autograd-checks=parity", "--autograd-devices=cpu,cuda", "-rs", *args)


def test_correct_ops_pass_on_the_fake_device(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "correct", "-v")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines_random([
        "*test_correct_linear[[]parity-cuda[]] PASSED*",
        "*test_correct_sort[[]parity-cuda[]] PASSED*",
        "SKIPPED [[]1[]] test_ops.py:* CPU is the ground truth here: the items of the other devices compare against it",
    ])


def test_a_device_only_gradient_bug_fails_naming_argument_and_device(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "gradient_bug", "--autograd-seed=2")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "gradient w.r.t. `input` from cuda differs from cpu",
        "  check parity, device cuda, dtype float32, sample 0",
        "  argument: input",
        "  worst element: grad input[[]*]: expected *, got *",
        "  max abs error *, max rel error * (atol *, rtol 0.0001); * of 12 elements differ",
        "  seed: *",
        '  rerun: pytest "test_ops.py::test_gradient_bug[[]parity-cuda[]]" --autograd-seed=2 --autograd-devices=cuda',
    ], consecutive=True)


def test_a_device_only_forward_bug_fails_naming_the_output(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "forward_bug")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "output of cuda differs from cpu",
        "  check parity, device cuda, dtype float32, sample 0",
        "  output: output",
        "  worst element: output[[]*]: expected *, got *",
        "  max abs error 0.001*, max rel error * (atol *, rtol 0.0001); 20 of 20 elements differ",
    ], consecutive=True)


def test_integer_outputs_must_match_exactly(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "integer_bug")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "output 1 of cuda differs from cpu",
        "  check parity, device cuda, dtype float32, sample 0",
        "  output: output 1",
        "  worst element: output 1[[]*]: expected *, got *",
        "  compared exactly (integer/bool values); 15 of 15 elements differ",
    ], consecutive=True)


@pytest.mark.parametrize("test, refusal", [
    ("device_only_kernel", "linear_kernel: CUDA tensors only"),
    ("device_only_backward", "scale_backward_kernel: CUDA tensors only"),  # a plain-torch forward
])
def test_an_op_whose_forward_or_backward_does_not_run_on_cpu_is_skipped_by_parity_saying_why(
        pytester, run_pytest, test, refusal):
    result = run_parity(pytester, run_pytest, "-k", test, "--autograd-devices=cuda")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        f"SKIPPED [[]1[]] test_ops.py:*: the op does not run on cpu (sample 0: RuntimeError: {refusal}): parity has "
        "no CPU run to compare the cuda run with; the other checks judge the op on cuda",
    ])


def test_an_op_whose_backward_raises_on_the_device_too_fails_parity_there(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "backward_refused_on_both", "--autograd-devices=cuda")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's backward raised RuntimeError: scale_backward_kernel: no kernel for this input",
    ])


def test_an_op_that_raises_on_the_device_too_fails_parity_there(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "raising_everywhere", "--autograd-devices=cuda")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's forward raised RuntimeError: linear_kernel: no kernel for this input",
        "  check parity, device cuda, sample 0",
    ], consecutive=True)


def test_samples_the_op_refuses_on_cpu_are_noted_and_the_others_compared(pytester, run_pytest):
    result = run_parity(pytester, run_pytest, "-k", "refusing_one_row", "--autograd-devices=cuda")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*AutogradNote: parity: samples not compared, the op does not run on cpu there (sample 1: RuntimeError: "
        "linear_kernel: no CPU kernel for a single row)",
    ])


@pytest.fixture
def tf32_switched_on():
    """As ``torch.set_float32_matmul_precision("high")`` in a project's conftest; restored after the test."""
    matmul = torch.backends.cuda.matmul
    name, on = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
    before = getattr(matmul, name)
    setattr(matmul, name, on)
    yield
    setattr(matmul, name, before)


def test_with_tf32_switched_on_parity_compares_the_device_in_full_float32(pytester, run_pytest, tf32_switched_on):
    result = run_parity(pytester, run_pytest, "-k", "linear_in_tf32", "--autograd-devices=cuda")
    result.assert_outcomes(passed=1)
    matmul = torch.backends.cuda.matmul
    assert matmul.fp32_precision == "tf32" if hasattr(matmul, "fp32_precision") else matmul.allow_tf32, \
        "the project's switch is restored after the check"


def test_with_tf32_switched_on_a_device_only_bug_still_fails(pytester, run_pytest, tf32_switched_on):
    result = run_parity(pytester, run_pytest, "-k", "gradient_bug", "--autograd-devices=cuda")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gradient w.r.t. `input` from cuda differs from cpu"])


def test_the_rerun_command_selects_the_fake_device_item(pytester, run_pytest):
    first = run_parity(pytester, run_pytest, "-k", "gradient_bug")
    first.assert_outcomes(failed=1, skipped=1)
    again = run_pytest("test_ops.py::test_gradient_bug[parity-cuda]", "--autograd-seed=0", "--autograd-devices=cuda")
    again.assert_outcomes(failed=1)


# --- compare_runs, where parity decides, on two different runs ---------------------------------------


def parity_context(op, sample):
    from pytest_autograd.engine.case import build_case
    from pytest_autograd.checks.base import CheckContext

    case = build_case({"op": op}, [sample])
    return CheckContext("parity", case, "cuda", seed=0)


def verdict(op_on_cpu, op_on_device, *args):
    """compare_runs on two runs, as parity calls it; returns the failure report or None."""
    from pytest_autograd import Sample
    from pytest_autograd.checks._pairs import compare_runs
    from pytest_autograd.results.report import CheckFailure

    sample = Sample(*args)
    context = parity_context(op_on_cpu, sample)
    cpu = context.prepare(sample, device="cpu")
    device = context.prepare(sample, device="cpu")
    try:
        for _ in context.samples():
            compare_runs(context, (cpu, context.run_op(cpu)), (device, context.run_op(device, fn=op_on_device)),
                         expected_label="cpu", got_label="cuda")
    except CheckFailure as failure:
        return failure.report
    return None


def linear_args():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, generator=generator), torch.randn(5, 3, generator=generator), torch.randn(5)


def test_compare_runs_passes_identical_runs():
    from reference_ops import LinearFunction

    assert verdict(LinearFunction, LinearFunction.apply, *linear_args()) is None


def test_compare_runs_fails_on_a_gradient_difference():
    from reference_ops import LinearFunction
    from reference_ops.buggy import LinearWeightGradTransposed

    report = verdict(LinearFunction, LinearWeightGradTransposed.apply, *linear_args())
    assert report.summary == "gradient w.r.t. `weight` from cuda differs from cpu"
    assert (report.check, report.device, report.argument, report.sample) == ("parity", "cuda", "weight", 0)
    assert report.worst.startswith("grad weight[")


def test_compare_runs_fails_on_a_detached_output_with_a_hint():
    from reference_ops import MyReLU

    report = verdict(MyReLU, lambda x: MyReLU.apply(x).detach(), torch.tensor([1.0, -2.0]))
    assert report.summary == "output of cuda does not require grad, but cpu's does"
    assert report.hint.startswith("forward returned a tensor detached from the graph, or marked it with "
                                  "ctx.mark_non_differentiable")


def test_compare_runs_fails_on_a_different_dtype_or_output_count():
    from reference_ops import MyReLU

    x = torch.tensor([1.0, -2.0])
    report = verdict(MyReLU, lambda x: MyReLU.apply(x).double(), x)
    assert report.summary == "output of cuda has dtype torch.float64, cpu gives torch.float32"
    report = verdict(MyReLU, lambda x: (MyReLU.apply(x), x * 2), x)
    assert report.summary == "cuda returned 2 tensor output(s), cpu returned 1"


def test_compare_runs_hints_at_a_missing_gradient():
    from reference_ops import ElementwiseMul

    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
    report = verdict(ElementwiseMul, lambda a, b: a.detach() * b, a, b)
    assert report.summary == "gradient w.r.t. `a` from cuda differs from cpu"
    assert report.hint == "the gradient is all zeros (backward returned None for this input?)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_real_gpu_parity_passes_correct_ops_and_catches_device_only_bugs(pytester, run_pytest):
    pytester.makeconftest("class FakeCudaTensor:\n    pass\n")  # the ops only look for x.is_cuda here
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=parity", "--autograd-devices=cpu,cuda", "-v")
    result.assert_outcomes(passed=2, failed=3, skipped=5)
    result.stdout.fnmatch_lines_random([
        "*test_correct_linear[[]parity-cuda[]] PASSED*",
        "*test_correct_sort[[]parity-cuda[]] PASSED*",
        "gradient w.r.t. `input` from cuda differs from cpu",
        "output of cuda differs from cpu",
        "output 1 of cuda differs from cpu",
    ])
