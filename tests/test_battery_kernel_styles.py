"""The full default battery on correct ops written the way real kernels are: no false alarm.

Float32-only kernels (raising on float64, or computing in float32), an op
more precise than its textbook reference, a reentrant checkpoint, a
declared straight-through estimator, a backward without double backward.
Their planted-bug twins fail in the tests of each feature.
"""

import pytest
import torch

from reference_ops.known_patterns import Square, SquareNoDoubleBackward, square_samples
from reference_ops.low_precision import (
    GatedComputesInFloat32,
    GatedFloat32Only,
    GatedFloat32OnlySilent,
    gated_reference,
    gated_samples,
)
from reference_ops.surrogate import (
    SignStraightThrough,
    block_reference,
    block_samples,
    checkpointed_block,
    sign_samples,
    sign_straight_through_reference,
)
from reference_ops.variance import TwoPassVariance, textbook_variance_reference, variance_samples

pytestmark = [
    pytest.mark.filterwarnings("ignore::pytest_autograd.engine.notes.AutogradNote"),
    # torch.utils.checkpoint warns when the checks call the op without gradients (finite differences, no-grad subsets)
    pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad=True:UserWarning"),
]


@pytest.mark.autograd_op(op=GatedFloat32Only, reference=gated_reference)
def test_float32_only_kernel_with_a_reference():
    return gated_samples()


@pytest.mark.autograd_op(op=GatedFloat32Only)
def test_float32_only_kernel_without_a_reference():
    return gated_samples()


@pytest.mark.autograd_op(op=GatedComputesInFloat32)
def test_kernel_computing_in_float32_whatever_it_gets():
    return gated_samples()


@pytest.mark.autograd_op(op=GatedFloat32OnlySilent, reference=gated_reference, dtypes=(torch.float32,))
def test_kernel_wrong_in_float64_declared_float32_only():
    return gated_samples()


@pytest.mark.autograd_op(op=TwoPassVariance, reference=textbook_variance_reference)
def test_two_pass_variance_against_the_textbook_formula():
    return variance_samples()


@pytest.mark.autograd_op(op=checkpointed_block, reference=block_reference)
def test_reentrant_checkpoint():
    return block_samples()


@pytest.mark.autograd_op(op=SignStraightThrough, reference=sign_straight_through_reference, surrogate_grad=True)
def test_declared_straight_through_estimator():
    return sign_samples()


@pytest.mark.autograd_op(op=SquareNoDoubleBackward, reference=lambda x: x * x, double_backward=False)
def test_backward_without_double_backward_declared():
    return square_samples()


@pytest.mark.autograd_op(op=Square, reference=lambda x: x * x)
def test_square_through_zero():
    return square_samples()
