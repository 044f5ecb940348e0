"""A GPU kernel that faults (an illegal memory access, a device-side assert) fails where it faults and is never
taken for the op refusing an input; the device's later items fail naming that first fault.

Proven on a machine without a GPU with parity's fake ``cuda`` device (``tests/test_check_parity.py``): the op
raises CUDA's message on it, and from then on every op call there raises it again, as a faulted CUDA context does;
``device_is_broken`` (a synchronisation that fails after a real fault) is told the same.
"""

import pytest
import torch

from pytest_autograd.engine import device_faults
from pytest_autograd.engine.device_faults import DeviceFault, forget_all, is_device_fault
from pytest_autograd.engine.outcomes import OpRaised, raised_by_op
from test_check_parity import FAKE_CUDA

ILLEGAL_ACCESS = ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
                  "reported at some other API call, so the stacktrace below might be incorrect.")

OPS = f"""
import pytest
import torch
from conftest import FakeCudaTensor
from reference_ops import Cube

FAULTED = []

def cube_faulting_in_float64_on_the_device(x):
    if isinstance(x, FakeCudaTensor) and (FAULTED or x.dtype == torch.float64):
        FAULTED.append(True)  # from now on every call on the device fails, as after a real fault
        raise RuntimeError({ILLEGAL_ACCESS!r})
    return Cube.apply(x)

@pytest.mark.autograd_op(op=cube_faulting_in_float64_on_the_device)
def test_faulty():
    return [(torch.randn(3, 4),)]

@pytest.mark.autograd_op(op=cube_faulting_in_float64_on_the_device)
def test_correct_but_after_the_fault():
    return [(torch.randn(5),)]
"""


@pytest.fixture(autouse=True)
def no_faulted_device():
    forget_all()
    yield
    forget_all()


@pytest.fixture
def broken_device(monkeypatch):
    """The device fails every call, as after a real fault."""
    monkeypatch.setattr(device_faults, "device_is_broken", lambda: True)


def test_cudas_sticky_errors_are_faults_and_other_errors_are_not(broken_device):
    assert is_device_fault(RuntimeError(ILLEGAL_ACCESS))
    assert is_device_fault(RuntimeError("CUDA error: device-side assert triggered"))
    assert is_device_fault(RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"))
    assert not is_device_fault(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_device_fault(RuntimeError("CUDA error: invalid configuration argument\nCompile with "
                                            "`TORCH_USE_CUDA_DSA` to enable device-side assertions."))
    assert not is_device_fault(ValueError("illegal memory access"))  # not an error torch or Triton raise
    assert isinstance(raised_by_op("forward", RuntimeError(ILLEGAL_ACCESS)), DeviceFault)
    assert not isinstance(raised_by_op("forward", RuntimeError(ILLEGAL_ACCESS)), OpRaised), \
        "a fault must not be caught as the op refusing an input"
    assert isinstance(raised_by_op("forward", RuntimeError("float64 is not supported")), OpRaised)


def test_the_words_of_a_fault_on_a_device_that_still_works_are_the_ops_own_error():
    # an op quoting CUDA's words, or an ordinary CUDA error: the device answers, so nothing is broken
    assert not is_device_fault(RuntimeError(ILLEGAL_ACCESS))
    assert isinstance(raised_by_op("forward", RuntimeError("the loads would hit a misaligned address")), OpRaised)


def test_a_size_refused_with_a_faults_words_on_a_working_device_is_noted_not_failed():
    from pytest_autograd import run_checks
    from reference_ops import Cube

    def cube_for_multiples_of_4(x):
        if x.shape[0] % 4:
            raise RuntimeError("cube_kernel: the vectorized loads would hit a misaligned address")
        return Cube.apply(x)

    (outcome,) = run_checks(cube_for_multiples_of_4, torch.randn(4, 3), checks=["sizes"])
    assert outcome.status == "passed", outcome.detail


def test_a_fault_fails_where_it_happens_and_the_devices_later_items_name_it(pytester, run_pytest, broken_device):
    pytester.makeconftest(FAKE_CUDA)
    pytester.makepyfile(test_ops=OPS)
    result = run_pytest("--autograd-checks=gradcheck", "--autograd-devices=cpu,cuda", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_faulty[[]gradcheck-cuda[]] _*",
        "the op's forward faulted on cuda: RuntimeError: CUDA error: an illegal memory access was encountered",
        "  check gradcheck, device cuda, sample 0",
        "  cuda cannot run anything more in this process after such a fault: its later items fail, naming this one",
        "  hint: the GPU reports a faulting kernel late, at a later call: rerun this item alone with "
        "CUDA_LAUNCH_BLOCKING=1*",
    ])
    result.stdout.fnmatch_lines([
        "*_ test_correct_but_after_the_fault[[]gradcheck-cuda[]] _*",
        "not run: cuda has been unusable in this process since `cube_faulting_in_float64_on_the_device` faulted it "
        "in check gradcheck (RuntimeError: CUDA error: an illegal memory access was encountered)",
    ])
    result.stdout.no_fnmatch_line("*raises on float64*")  # the fault was not taken for a float64 refusal


def test_a_kernel_faulting_at_a_size_the_samples_do_not_have_fails_sizes_naming_the_size(broken_device):
    # A size the op raises at is noted as outside its contract; a fault there is the kernel's bug, not a refusal.
    from pytest_autograd import run_checks
    from reference_ops import Cube

    def cube_writing_past_its_last_block(x):
        if x.shape[0] > 1000:
            raise RuntimeError(ILLEGAL_ACCESS)
        return Cube.apply(x)

    (outcome,) = run_checks(cube_writing_past_its_last_block, torch.randn(4, 3), checks=["sizes"])
    assert outcome.status == "failed", outcome.detail
    assert outcome.detail.startswith("the op's forward faulted on cpu when dim 0 of `x` (size 4 in your sample) is "
                                     "2051: RuntimeError: CUDA error: an illegal memory access was encountered")


def test_a_gpu_fault_met_on_a_cpu_item_fails_it_and_leaves_cpu_usable(broken_device):
    from pytest_autograd import run_checks
    from pytest_autograd.engine.device_faults import fault_on

    def calls_a_faulting_gpu_kernel(x):
        raise RuntimeError(ILLEGAL_ACCESS)

    (outcome,) = run_checks(calls_a_faulting_gpu_kernel, torch.randn(3), checks=["gradcheck"])
    assert outcome.status == "failed" and outcome.detail.startswith("the op's forward faulted on cpu")
    assert fault_on("cpu") is None
    (after,) = run_checks(lambda x: x * 2, torch.randn(3), checks=["gradcheck"])
    assert after.status == "passed", after.detail


def test_opchecks_dtype_probe_does_not_take_a_fault_for_a_missing_kernel(broken_device):
    from pytest_autograd import run_checks

    @torch.library.custom_op("device_fault_tests::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float16:
            raise RuntimeError(ILLEGAL_ACCESS)
        return x * 2

    scale.register_fake(lambda x: torch.empty_like(x))
    scale.register_autograd(lambda ctx, grad: grad * 2)
    (outcome,) = run_checks(scale, torch.randn(4), checks=["opcheck"])
    assert outcome.status == "failed", outcome.detail
    assert "faulted" in outcome.detail


def test_a_fault_is_confirmed_on_the_items_own_device(monkeypatch):
    synchronised = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synchronised.append(device))
    with device_faults.item_on("cuda:1"):
        assert not device_faults.device_is_broken()
    with device_faults.item_on("cpu"):
        assert not device_faults.device_is_broken()
    assert synchronised == ["cuda:1", None]  # a CPU item: the current device
