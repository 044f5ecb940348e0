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
