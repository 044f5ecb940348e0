"""Arguments and outputs of unusual shape: constants, dicts, lists, non-tensor results."""

BATCH_NORM = """
    import pytest, torch
    import torch.nn.functional as F

    def batch_norm(x, running_mean, running_var, weight, bias):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training=False)

    def sample():
        return [(torch.randn(4, 3), torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3))]
"""


def test_constants_keep_batch_norm_running_stats_out_of_differentiation(pytester, run_pytest):
    pytester.makepyfile(BATCH_NORM + """
    @pytest.mark.autograd_op(op=batch_norm, reference=batch_norm, constants=("running_mean", 2),
                             checks=["gradcheck", "gradgradcheck", "reference"])
    def test_batch_norm():
        return sample()
    """)
    run_pytest().assert_outcomes(passed=3)


def test_an_argument_torch_refuses_to_differentiate_gets_a_hint_naming_constants(pytester, run_pytest):
    pytester.makepyfile(BATCH_NORM + """
    @pytest.mark.autograd_op(op=batch_norm, checks=["gradcheck"])
    def test_batch_norm():
        return sample()
    """)
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward raised RuntimeError*not differentiable with respect to argument 'running_mean'*",
        "*hint: *declare the ones that are constants on the marker, e.g. constants=*",
    ])


def test_constants_naming_no_argument_is_a_usage_error_listing_the_arguments(pytester, run_pytest):
    pytester.makepyfile(BATCH_NORM + """
    @pytest.mark.autograd_op(op=batch_norm, constants=["running_meen"], checks=["gradcheck"])
    def test_batch_norm():
        return sample()
    """)
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "constants=['running_meen'] names 'running_meen', which is not an argument of the op; "
        "its arguments are: x, running_mean, running_var, weight, bias.",
    ])
    assert "Traceback" not in result.stdout.str()


def test_dict_outputs_are_checked_value_by_value(pytester, run_pytest):
    pytester.makepyfile("""
    import pytest, torch

    def op(x):
        return {"double": x * 2, "triple": x * 3}

    def reference(x):
        return {"double": x * 2, "triple": x * 4}

    @pytest.mark.autograd_op(op=op, reference=reference, checks=["gradcheck", "reference"])
    def test_dict():
        return (torch.randn(3),)
    """)
    result = run_pytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["output 1 of the op differs from the reference"])


def test_an_op_returning_no_tensor_is_a_usage_error(pytester, run_pytest):
    pytester.makepyfile("""
    import pytest, torch

    @pytest.mark.autograd_op(op=lambda x: float(x.detach().sum()), checks=["gradcheck"])
    def test_float():
        return (torch.randn(3),)
    """)
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["the op returned float (*), which holds no tensor: there is nothing to check.*"])


def test_tensors_inside_a_list_argument_are_refused_with_a_wrapper_suggestion(pytester, run_pytest):
    pytester.makepyfile("""
    import pytest, torch

    @pytest.mark.autograd_op(op=torch.cat, checks=["gradcheck"])
    def test_cat():
        return ([torch.randn(3), torch.randn(2)],)
    """)
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*sample 0 argument 0 is a list of tensors; only top-level tensor arguments are differentiated.*"
        "op=lambda a, b: torch.cat([[]a, b[]])*",
    ])


def test_a_function_given_as_its_apply_has_its_arguments_named_by_its_forward():
    import torch

    from pytest_autograd import run_checks
    from pytest_autograd.engine.case import argument_names
    from reference_ops import LinearFunction

    assert argument_names(LinearFunction.apply) == ["input", "weight", "bias"]
    outcome, = run_checks(LinearFunction.apply, torch.randn(3, 4), torch.randn(2, 4), torch.randn(2),
                          checks=["gradcheck"], constants=("bias",))
    assert outcome.status == "passed", outcome.detail
