"""autograd_model(autocast=...): each op judged under autocast on what the model's mixed-precision step hands it."""

import textwrap

import pytest
import torch

from pytest_autograd.engine.model_scan import autograd_scan
from pytest_autograd.engine.outcomes import UsageProblem

MODELS = """
import pytest, torch
from torch import nn
from reference_ops import LinearFunction
from reference_ops.training import LinearAutocast


class Head(nn.Module):
    '''An autocast layer (its output is bfloat16), then the op on it and a float32 weight.'''

    def __init__(self, function):
        super().__init__()
        torch.manual_seed(0)
        self.function = function
        self.first = nn.Linear(16, 16)
        self.weight = nn.Parameter(torch.randn(8, 16) / 4)

    def forward(self, x):
        return self.function.apply(self.first(x), self.weight)


@pytest.mark.autograd_model(autocast=torch.bfloat16, checks=["autocast"])
def test_a_linear_after_an_autocast_layer():
    return Head(LinearFunction), (torch.randn(4, 16),)


@pytest.mark.autograd_model(autocast=torch.bfloat16, checks=["autocast"])
def test_a_custom_fwd_linear_after_an_autocast_layer():
    return Head(LinearAutocast), (torch.randn(4, 16),)


@pytest.mark.autograd_model(checks=["autocast"])
def test_a_linear_in_a_float32_step():
    return Head(LinearFunction), (torch.randn(4, 16),)
"""


def test_a_backward_that_meets_a_bfloat16_activation_and_a_float32_weight_fails_only_in_the_autocast_step(
        pytester, run_pytest):
    pytester.makepyfile(test_models=MODELS)
    result = run_pytest("-rf")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "FAILED test_models.py::test_a_linear_after_an_autocast_layer[[]autocast-cpu[]]*",
    ])
    result.stdout.fnmatch_lines([
        "autocast-cpu: 1 op checked, 1 wrong: `LinearFunction` at test_models.py:* (autocast)",
        "*checked at input[[]4, 16[]] bfloat16, weight[[]8, 16[]] float32",
        "*autocast-cpu failed: the op's backward raised RuntimeError under torch.autocast('cpu', "
        "dtype=torch.bfloat16), after its forward ran there*",
    ])
    result.stdout.fnmatch_lines(["*hint: decorate forward with @torch.amp.custom_fwd(device_type='cpu')*"])


def test_autograd_scan_judges_the_autocast_check_on_the_step_under_autocast_and_the_others_on_the_plain_one():
    namespace = {}
    exec(textwrap.dedent(MODELS), namespace)  # noqa: S102 - the models above, as a script would define them
    from reference_ops import LinearFunction

    found = autograd_scan(namespace["Head"](LinearFunction), torch.randn(4, 16), checks=["autocast", "gradcheck"],
                          autocast=torch.bfloat16)
    (verdict,) = found.verdicts
    statuses = {(o.check, c.text.split(":")[0]): o.status for c in verdict.checked for o in c.outcomes}
    assert [o.check for o in verdict.outcomes if o.status == "failed"] == ["autocast"], found.render()
    assert any(o.check == "gradcheck" and o.status == "passed" for o in verdict.outcomes), statuses


def test_autocast_must_name_a_16_bit_dtype():
    with pytest.raises(UsageProblem, match=r"autocast= must be torch.float16 or torch.bfloat16 .* got torch.float32"):
        autograd_scan(torch.nn.Linear(4, 4), torch.randn(2, 4), autocast=torch.float32)


def test_under_autocast_the_other_checks_still_judge_every_op_on_the_plain_step(pytester, run_pytest):
    pytester.makepyfile(test_models="""
        import pytest, torch
        from torch import nn
        from reference_ops.training import LinearAutocast


        class DoubledInputGrad(LinearAutocast):
            @staticmethod
            @torch.amp.custom_bwd(device_type="cpu")
            def backward(ctx, grad):
                x, w = ctx.saved_tensors
                return 2 * (grad @ w), grad.T @ x   # BUG: the input's gradient twice too large


        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.first = nn.Linear(16, 16)
                self.weight = nn.Parameter(torch.randn(8, 16) / 4)

            def forward(self, x):
                return DoubledInputGrad.apply(self.first(x), self.weight)


        @pytest.mark.autograd_model(autocast=torch.bfloat16, checks=["gradcheck", "autocast"])
        def test_model():
            return Head(), (torch.randn(4, 16),)
    """)
    result = run_pytest("-rf")
    result.stdout.fnmatch_lines(["FAILED test_models.py::test_model[[]gradcheck-cpu[]]*"])
    assert "unknown option" not in result.stdout.str()


def test_the_marker_refuses_an_unknown_isolation_mode_and_a_world_size(pytester, run_pytest):
    pytester.makepyfile(test_models="""
        import pytest, torch

        @pytest.mark.autograd_model(isolate="bogus")
        def test_model():
            return torch.nn.Linear(2, 2), (torch.randn(2, 2),)
    """)
    result = run_pytest()
    assert "passed" not in result.parseoutcomes() and "skipped" not in result.parseoutcomes(), result.stdout.str()
    result.stdout.fnmatch_lines(["*isolate=: unknown isolation mode 'bogus'; use one of explore, all, off*"])
