"""The probing strategy's guarantee: one wrong element anywhere in a million is caught and named."""

import torch

from pytest_autograd.checks._derivatives import ATOL, RTOL, find_derivative_error

SHAPE = (1000, 1000)


class SquareOneElementDoubled(torch.autograd.Function):
    """x * x, one cheap pass over a million elements, whose backward doubles one element's gradient (``WRONG``)."""

    WRONG = (0, 0)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad_x = 2 * x * grad
        grad_x[SquareOneElementDoubled.WRONG] *= 2
        return grad_x


def check_once(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=generator, dtype=torch.float64).requires_grad_(True)
    wrong = tuple(int(torch.randint(1, size - 1, (1,), generator=generator)) for size in SHAPE)  # interior
    SquareOneElementDoubled.WRONG = wrong
    error = find_derivative_error(lambda leaves: [SquareOneElementDoubled.apply(*leaves)], [x], ["x"], ["output"],
                                  generator)
    return wrong, error


def test_a_single_doubled_element_of_a_million_is_caught_and_named_in_at_least_99_of_100_runs():
    caught = 0
    for seed in range(100):
        wrong, error = check_once(seed)
        if error is not None:
            caught += 1
            assert error.element == f"grad x[{wrong[0]}, {wrong[1]}]", error
            assert abs(error.got - 2 * error.expected) <= 1e-6 * abs(error.expected) + error.tolerance
    assert caught >= 99


def test_a_correct_op_on_a_million_elements_passes():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=generator, dtype=torch.float64).requires_grad_(True)
    assert find_derivative_error(lambda leaves: [leaves[0] ** 3], [x], ["x"], ["output"], generator) is None


def test_the_probe_tolerance_is_measured_not_scaled_with_the_input_size():
    # The planted error is a tiny fraction of the directional derivative over a million
    # elements (sum |g . d| ~ 1e6), yet it is well above atol + rtol * |g_i|: caught.
    _, error = check_once(7)
    assert error is not None and error.tolerance < 10 * (ATOL + RTOL * abs(error.expected))
