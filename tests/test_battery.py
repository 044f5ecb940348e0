"""The full default battery of checks on every shipped example op.

This is what the README's first command runs: one marked test per op, each
expanding into every check that applies, on every device asked for.
"""

import pytest
import torch

from reference_ops import EXAMPLES


def _battery_test(name, example):
    @pytest.mark.autograd_op(op=example.function, reference=example.reference)
    def test(autograd_device):
        return example.samples(generator=torch.Generator().manual_seed(0))

    test.__name__ = f"test_{name}"
    test.__doc__ = f"{example.function.__name__}: every check that applies."
    return test


for _name, _example in EXAMPLES.items():
    globals()[f"test_{_name}"] = _battery_test(_name, _example)


def _extension_samples():
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return [
        (randn(7, 33), randn(5, 33), randn(5)),
        (randn(1, 7), randn(3, 7), None),
        (randn(0, 7), randn(3, 7), randn(3)),  # empty batch
        (randn(2, 3, 4), randn(5, 4), randn(5)),  # leading batch dims
    ]


def _extension_tests():
    from reference_ops import ExtLinearFunction, extension_available, load_extension

    if not extension_available():
        def test_extension_ops():
            pytest.skip("the C++ extension could not be built here (see reference_ops.extension for what to install)")

        return {"test_extension_ops": test_extension_ops}
    ops = load_extension()

    @pytest.mark.autograd_op(op=ExtLinearFunction, reference=torch.nn.functional.linear)
    def test_ext_linear_function(autograd_device):
        return _extension_samples()

    @pytest.mark.autograd_op(op=ops.linear_forward, reference=torch.nn.functional.linear)
    def test_ext_linear_op(autograd_device):
        return _extension_samples()

    return {"test_ext_linear_function": test_ext_linear_function, "test_ext_linear_op": test_ext_linear_op}


globals().update(_extension_tests())
