"""No false alarms: every correct op passes the transform and precision checks.

Marker tests over every op in ``reference_ops.EXAMPLES`` and the correct ops
of ``reference_ops.transforms``. A check that does not apply to an op (no
jvp, no vmap rule, not a torch.library op) is skipped, never failed.
compile runs on the aot_eager backend here: inductor costs seconds per op.
"""

import pytest
import torch

from reference_ops import EXAMPLES
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

CHECKS = ["forward_ad", "vmap", "compile", "opcheck", "precision", "extreme"]
OPTIONS = {"checks": CHECKS, "compile_backend": "aot_eager"}


def _marked(name, op, reference, samples):
    @pytest.mark.autograd_op(op=op, reference=reference, **OPTIONS)
    def test():
        return samples(torch.Generator().manual_seed(0))

    test.__name__ = test.__qualname__ = f"test_{name}"
    return test


for _name, (_op, _reference, _samples) in EXAMPLES.items():
    globals()[f"test_{_name}"] = _marked(_name, _op, _reference, _samples)


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.mark.autograd_op(op=MulWithJvp, reference=torch.mul, **OPTIONS)
def test_mul_with_jvp():
    return [(_randn(3, 4), _randn(4, 3).T), (_randn(5), _randn(5))]


@pytest.mark.autograd_op(op=RowDot, **OPTIONS)
def test_row_dot():
    return [(_randn(3, 4), _randn(4)), (_randn(2, 3, 5), _randn(5))]


@pytest.mark.autograd_op(op=scaled_sin, **OPTIONS)
def test_scaled_sin():
    return [(_randn(3, 4), 2.0), (_randn(5), -0.5)]


@pytest.mark.autograd_op(op=scaled_row_sum, **OPTIONS)
def test_scaled_row_sum():
    return [(_randn(3, 4),)]


@pytest.mark.autograd_op(op=StableSoftmax, reference=softmax_reference, **OPTIONS)
def test_stable_softmax():
    return [(_randn(3, 5),), (_randn(7),)]


@pytest.mark.autograd_op(op=NaiveVariance, reference=naive_variance_reference, **OPTIONS)
def test_naive_variance():
    return [(1000 + _randn(4, 32),), (_randn(6),)]
