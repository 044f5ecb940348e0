"""op= an nn.Module instance: its parameters are differentiated and checked like inputs, the module untouched."""

import torch

from pytest_autograd.engine.api import run_checks
from reference_ops.modules import FunctionLinear

MODULES = """
import pytest
import torch
from torch import nn
from reference_ops.modules import FunctionLinear, FunctionLinearWeightGradTransposed

torch.manual_seed(0)
linear = nn.Linear(3, 2)
before = {name: value.clone() for name, value in linear.state_dict().items()}


@pytest.mark.autograd_op(op=linear, reference=torch.nn.functional.linear)
def test_nn_linear():
    return [(torch.randn(4, 3),), (torch.randn(2, 5, 3),)]


def test_the_module_is_unchanged():
    assert all(torch.equal(before[name], value) for name, value in linear.state_dict().items())
    assert linear.weight.dtype == torch.float32 and linear.weight.grad is None


@pytest.mark.autograd_op(op=FunctionLinear(3, 2), reference=nn.Linear(3, 2))
def test_function_linear():
    return [(torch.randn(4, 3),)]


@pytest.mark.autograd_op(op=FunctionLinearWeightGradTransposed(3, 2))
def test_function_linear_weight_grad_transposed():
    return [(torch.randn(4, 3),)]
"""


def test_a_correct_module_passes_every_default_check_and_a_wrong_parameter_gradient_fails(pytester, run_pytest):
    pytester.makepyfile(test_modules=MODULES)
    result = run_pytest("-v", "-p", "no:randomly")
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1, result.stdout.str()
    result.stdout.fnmatch_lines_random([
        "*test_nn_linear[[]gradcheck-cpu[]] PASSED*",
        "*test_nn_linear[[]reference-cpu[]] PASSED*",
        "*test_the_module_is_unchanged PASSED*",
        "*test_function_linear[[]gradgradcheck-cpu[]] PASSED*",
        "*test_function_linear_weight_grad_transposed[[]gradcheck-cpu[]] FAILED*",
        "gradient of output w.r.t. `weight` does not match the numerical derivative",
        "  output: output, argument: weight",
    ])


def test_a_reference_module_with_different_parameters_is_compared_with_the_same_parameters():
    outcomes = run_checks(FunctionLinear(3, 2), torch.randn(4, 3), reference=torch.nn.Linear(3, 2),
                          checks=["reference"])
    assert [o.status for o in outcomes] == ["passed"], outcomes


def test_frozen_parameters_are_constants_and_buffers_are_not_inputs():
    linear = torch.nn.Linear(3, 2)
    linear.bias.requires_grad_(False)
    norm = torch.nn.BatchNorm1d(3)
    for module in (linear, norm):
        outcomes = run_checks(module, torch.randn(5, 3), checks=["gradcheck", "gradgradcheck", "mutation"])
        assert [o.status for o in outcomes] == ["passed"] * 3, outcomes
    assert int(norm.num_batches_tracked) == 0 and torch.equal(norm.running_mean, torch.zeros(3))


def test_the_shipped_extension_module_passes_when_the_extension_builds():
    import pytest

    from reference_ops import extension_available

    if not extension_available():
        pytest.skip("the C++ extension cannot be built here")
    from reference_ops import ExtLinear

    outcomes = run_checks(ExtLinear(3, 2), torch.randn(4, 3), reference=torch.nn.functional.linear)
    assert not [o for o in outcomes if o.status == "failed"], outcomes
    assert {o.check for o in outcomes if o.status == "passed"} >= {"gradcheck", "gradgradcheck", "reference"}
