"""Every correct example op passes the core checks through the marker (no false alarms).

The plugin is used directly here, as a user would: each test below expands
into gradcheck, gradgradcheck, parity and reference items. ``checks=`` keeps
checks added later out of this file (they have their own tests); parity is
skipped unless a non-CPU device is given (``--autograd-devices=cpu,cuda``).
"""

import pytest
import torch
import torch.nn.functional as F

from reference_ops import DOUBLE_DIFFERENTIABLE, EXAMPLES, LinearFunction

CORE_CHECKS = ["gradcheck", "gradgradcheck", "parity", "reference"]


def _marked_example(name, example):
    checks = CORE_CHECKS if name in DOUBLE_DIFFERENTIABLE else [c for c in CORE_CHECKS if c != "gradgradcheck"]

    @pytest.mark.autograd_op(op=example.function, reference=example.reference, checks=checks)
    def test(autograd_device):
        return example.samples()  # drawn from the RNG the plugin seeds for each item

    test.__name__ = f"test_{name}_passes_the_core_checks"
    test.__doc__ = f"{example.function.__name__} against {getattr(example.reference, '__name__', 'its reference')}."
    return test


for _name, _example in EXAMPLES.items():
    globals()[f"test_{_name}_passes_the_core_checks"] = _marked_example(_name, _example)


@pytest.mark.autograd_op(op=LinearFunction, reference=F.linear, checks=["gradcheck", "gradgradcheck", "reference"])
def test_a_200k_element_linear_is_checked_by_probing():
    """256x320 input and 384x320 weight: far too large for a Jacobian, checked in seconds by probes."""
    return [(torch.randn(256, 320), torch.randn(384, 320) / 18, torch.randn(384))]


def test_every_example_got_its_marked_test():
    names = {name for name in globals() if name.endswith("_passes_the_core_checks")}
    assert names == {f"test_{name}_passes_the_core_checks" for name in EXAMPLES}
