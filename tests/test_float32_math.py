"""full_float32: torch's TF32 switches off inside, each put back to the value it had after."""

import pytest
import torch

from pytest_autograd.engine.float32_math import _switches, full_float32


def switch_values():
    return [getattr(owner, name) for owner, name, _ in _switches()]


def test_inside_every_switch_means_full_float32_and_after_each_has_its_value_again():
    before = switch_values()
    with full_float32():
        assert switch_values() == [full for _, _, full in _switches()]
    assert switch_values() == before


def test_the_switches_are_restored_when_the_block_raises():
    before = switch_values()
    with pytest.raises(ZeroDivisionError):
        with full_float32():
            1 / 0
    assert switch_values() == before


def test_a_project_that_turned_tf32_on_has_it_on_again_after():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 matmuls, as many training scripts ask
    try:
        with full_float32():
            assert switch_values() == [full for _, _, full in _switches()]
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.set_float32_matmul_precision(before)


def test_checks_judge_in_full_float32_and_bench_times_the_projects_math_mode():
    from pytest_autograd import run_checks
    from pytest_autograd.checks.bench import check as bench
    from pytest_autograd.engine.running import _math_mode

    seen = {}
    current_check = []

    def scale(x):
        seen.setdefault(current_check[0], set()).add(tuple(switch_values()))
        return x * 2

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        project = tuple(switch_values())
        for check in ("gradcheck", "reference", "precision", "extreme"):
            current_check[:] = [check]
            run_checks(scale, torch.randn(8), reference=lambda x: x * 2, checks=[check])
        with _math_mode(bench):
            timed = tuple(switch_values())
    finally:
        torch.set_float32_matmul_precision(before)
    full = tuple(value for _, _, value in _switches())
    assert seen == {check: {full} for check in ("gradcheck", "reference", "precision", "extreme")}
    assert timed == project
