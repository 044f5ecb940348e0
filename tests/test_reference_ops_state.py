"""No false alarms: the correct stateful ops pass every default check, and the checks that watch state
across calls pass every other correct op shipped in ``reference_ops``.

Marker tests, run by the plugin as a user would. ``reference_ops.EXAMPLES``
get these checks through the battery and the hygiene test; the transform
ops and ``torch.nn.functional.batch_norm`` (which updates its running
statistics in place) get them here.
"""

import pytest
import torch
import torch.nn.functional as F

from reference_ops.state import STATE_EXAMPLES
from reference_ops.transforms import (
    MulWithJvp,
    NaiveVariance,
    RowDot,
    StableSoftmax,
    naive_variance_reference,
    scaled_row_sum,
    scaled_sin,
    softmax_reference,
)

STATE_CHECKS = ["mutation", "growth", "aliasing", "reentrancy", "rng"]


def _every_default_check(name, example):
    @pytest.mark.autograd_op(op=example.function, reference=example.reference, **example.options)
    def test():
        return example.samples(torch.Generator().manual_seed(0))

    test.__name__ = test.__qualname__ = f"test_{name}_passes_every_default_check"
    return test


for _name, _example in STATE_EXAMPLES.items():
    globals()[f"test_{_name}_passes_every_default_check"] = _every_default_check(_name, _example)


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.mark.autograd_op(op=MulWithJvp, reference=torch.mul, checks=STATE_CHECKS)
def test_mul_with_jvp():
    return [(_randn(3, 4), _randn(4, 3).T), (_randn(5), _randn(5))]


@pytest.mark.autograd_op(op=RowDot, checks=STATE_CHECKS)
def test_row_dot():
    return [(_randn(3, 4), _randn(4)), (_randn(2, 3, 5), _randn(5))]


@pytest.mark.autograd_op(op=scaled_sin, checks=STATE_CHECKS)
def test_scaled_sin():
    return [(_randn(3, 4), 2.0), (_randn(5), -0.5)]


@pytest.mark.autograd_op(op=scaled_row_sum, checks=STATE_CHECKS)
def test_scaled_row_sum():
    return [(_randn(3, 4),)]


@pytest.mark.autograd_op(op=StableSoftmax, reference=softmax_reference, checks=STATE_CHECKS)
def test_stable_softmax():
    return [(_randn(3, 5),), (_randn(7),)]


@pytest.mark.autograd_op(op=NaiveVariance, reference=naive_variance_reference, checks=STATE_CHECKS)
def test_naive_variance():
    return [(1000 + _randn(4, 32),), (_randn(6),)]


def batch_norm(x, weight, bias, running_mean, running_var):
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=True)


@pytest.mark.autograd_op(op=batch_norm, constants=("running_mean", "running_var"),
                         mutates=("running_mean", "running_var"), checks=STATE_CHECKS)
def test_torch_batch_norm_updating_running_statistics():
    return [(_randn(6, 3), 1 + _randn(3) / 4, _randn(3), _randn(3), 1 + torch.rand(3))]


def test_every_correct_state_op_got_its_marked_test():
    names = {name for name in globals() if name.endswith("_passes_every_default_check")}
    assert names == {f"test_{name}_passes_every_default_check" for name in STATE_EXAMPLES}
