"""full_float32: float32 matmuls and convolutions in full float32 inside, every switch as it was after, and every
one of torch's getters readable throughout (an op's backward may read them)."""

import pytest
import torch

from pytest_autograd.engine.float32_math import _restore, _save, full_float32, switches_state


def project_setting(setting):
    """Set the switches as a project would; 'matmul attribute': the newer per-backend attribute alone."""
    if setting == "matmul attribute":
        if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            pytest.skip("this torch has no fp32_precision attributes")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    elif setting != "default":
        torch.set_float32_matmul_precision(setting)


def readings():
    """What torch's getters say (or that they refuse), as a project would read them."""
    found = []
    for read in (lambda: torch.backends.cuda.matmul.allow_tf32, lambda: torch.backends.cudnn.allow_tf32,
                 torch.get_float32_matmul_precision):
        try:
            found.append(read())
        except RuntimeError:
            found.append("refused")
    return found


@pytest.fixture
def restored_afterwards():
    saved = _save()
    yield
    _restore(saved)


@pytest.mark.parametrize("setting", ["default", "high", "medium", "matmul attribute"])
def test_inside_everything_reads_full_float32_and_after_every_switch_is_as_it_was(setting, restored_afterwards):
    project_setting(setting)
    before, read_before = switches_state(), readings()
    with full_float32():
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
        with torch.backends.cudnn.flags(enabled=False):  # what conv2d_gradfix-style backwards do
            pass
    assert switches_state() == before
    assert readings() == read_before


def test_the_switches_are_restored_when_the_block_raises(restored_afterwards):
    project_setting("high")
    before = switches_state()
    with pytest.raises(ZeroDivisionError):
        with full_float32():
            1 / 0
    assert switches_state() == before
    assert torch.get_float32_matmul_precision() == "high"


def test_checks_judge_in_full_float32_and_bench_times_the_projects_math_mode(restored_afterwards):
    from types import SimpleNamespace

    from pytest_autograd import run_checks
    from pytest_autograd.checks.bench import check as bench
    from pytest_autograd.engine.case import OpCase
    from pytest_autograd.engine.running import _judging_mode

    seen = {}
    current_check = []

    class ReadsTheFlagsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.setdefault(current_check[0], set()).add(torch.get_float32_matmul_precision())
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            assert torch.backends.cudnn.allow_tf32 is False
            return grad * 2

    project_setting("high")
    for check in ("gradcheck", "reference", "precision", "extreme"):
        current_check[:] = [check]
        (outcome,) = run_checks(ReadsTheFlagsInBackward, torch.randn(8), reference=lambda x: x * 2, checks=[check])
        assert outcome.status == "passed", outcome.detail
    with _judging_mode(bench, SimpleNamespace(device="cpu", case=OpCase(op=None, samples=[]))):
        timed = torch.get_float32_matmul_precision()
    assert seen == {check: {"highest"} for check in ("gradcheck", "reference", "precision", "extreme")}
    assert timed == "high"
