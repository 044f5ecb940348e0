"""Mistakes in options, marker and test body give a clear message naming the fix, never a torch traceback."""

import pytest

HEADER = """
import pytest
import torch
from reference_ops import LinearFunction, MyReLU
"""


# A correct autograd.Function written into generated test files (indented for makepyfile).
DOUBLE = """
        class Double(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2
"""


def assert_no_traceback(result):
    text = result.stdout.str() + result.stderr.str()
    for sign_of_a_traceback in ("Traceback", "During handling", "site-packages", "pytest_autograd/", " in <module>",
                                "raise "):
        assert sign_of_a_traceback not in text, f"{sign_of_a_traceback!r} in the output:\n{text}"


# --- command line and ini: usage errors, exit code 4 ----------------------------------------------


def test_unknown_device_on_the_command_line_is_a_usage_error(pytester, run_pytest):
    result = run_pytest("--autograd-devices=cpu,tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --autograd-devices: unknown device 'tpu'; use one of cpu, cuda, mps, xpu, hpu, npu, "
        "optionally with an index such as cuda:1"])


def test_misspelt_device_index_is_a_usage_error(pytester, run_pytest):
    result = run_pytest("--autograd-devices=cuda-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --autograd-devices: unknown device 'cuda-1'*"])


def test_empty_device_list_is_a_usage_error(pytester, run_pytest):
    result = run_pytest("--autograd-devices=,")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --autograd-devices: no device given; use e.g. --autograd-devices=cpu,cuda"])


def test_unknown_device_in_the_ini_file_is_a_usage_error(pytester, run_pytest):
    pytester.makeini("[pytest]\nautograd_devices = cpu,gpu\n")
    result = run_pytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --autograd-devices: unknown device 'gpu'*"])


def test_unknown_check_on_the_command_line_is_a_usage_error_listing_known_checks(pytester, run_pytest):
    result = run_pytest("--autograd-checks=gradcheck,gradchek")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --autograd-checks: unknown check(s) 'gradchek' (did you mean gradcheck?); known checks are: gradcheck, gradgradcheck, "
        "parity, reference*"])


def test_non_integer_seed_is_a_usage_error(pytester, run_pytest):
    result = run_pytest("--autograd-seed=abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --autograd-seed: 'abc' is not an integer; pass e.g. --autograd-seed=1234 or 'random'"])


# --- the marker: mistakes fail their test -----------------------------------------------------------------


def marker_test(marker_args, body="return [(torch.randn(3, 4), torch.randn(2, 4), None)]"):
    return HEADER + f"""
@pytest.mark.autograd_op({marker_args})
def test_op():
    {body}
"""


def test_marker_mistakes_fail_their_test_naming_the_fix_and_the_session_goes_on(pytester, run_pytest):
    pytester.makepyfile(
        test_unknown_check=marker_test('op=LinearFunction, checks=["gradcheck", "gradchek"]'),
        test_unknown_skip=marker_test('op=LinearFunction, skip="paritty"'),
        test_unknown_device=marker_test('op=LinearFunction, devices=["cpu", "gpu"]'),
        test_missing_op=marker_test("reference=torch.nn.functional.linear"),
        test_op_not_callable=marker_test("op=42"),
        test_reference_not_callable=marker_test('op=LinearFunction, reference="F.linear"'),
        test_unknown_keyword=marker_test("op=LinearFunction, atoll=1e-3"),
        test_bad_double_backward=marker_test('op=LinearFunction, double_backward="no"'),
        test_negative_atol=marker_test("op=LinearFunction, atol=-1"),
    )
    result = run_pytest("--autograd-checks=gradcheck")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=9)
    result.stdout.fnmatch_lines_random([
        "*test_unknown_check.py::test_op: checks= names unknown check(s) 'gradchek' (did you mean gradcheck?); "
        "known checks are: gradcheck, gradgradcheck, parity, reference*",
        "*test_unknown_skip.py::test_op: skip= names unknown check(s) 'paritty' (did you mean parity?); known checks are: *",
        "*test_unknown_device.py::test_op: devices=: unknown device 'gpu'; use one of cpu, cuda, *",
        "*test_missing_op.py::test_op: @pytest.mark.autograd_op needs op=..., the Function or callable to check.",
        "*test_op_not_callable.py::test_op: op=42 is not callable; pass an autograd.Function subclass, "
        "a function on tensors, or a torch.ops / torch.library.custom_op operator.",
        "*test_reference_not_callable.py::test_op: reference='F.linear' is not callable; "
        "pass a function with the op's signature.",
        "*test_unknown_keyword.py::test_op: unknown @pytest.mark.autograd_op argument(s) atoll (did you mean atol?); "
        "known arguments are: *atol*",
        "*test_bad_double_backward.py::test_op: double_backward= must be True or False, got 'no'.",
        "*test_negative_atol.py::test_op: atol= must be a non-negative number, got -1.",
    ])
    assert_no_traceback(result)


def test_positional_function_class_is_a_collection_error_not_a_vanished_test(pytester, run_pytest):
    # A Function defined in the test file: the positional form stores the
    # mark on the class itself, which must not leak into other tests.
    pytester.makepyfile(
        """
        import pytest
        import torch

{double}        @pytest.mark.autograd_op(Double)
        def test_double():
            return [(torch.randn(3),)]

        def test_unrelated():
            pass
        """.replace("{double}", DOUBLE.lstrip("\n"))
    )
    result = run_pytest("--autograd-checks=gradcheck", "-W", "ignore::DeprecationWarning")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*::test_double: @pytest.mark.autograd_op(Double) passes the op positionally. pytest then treats the "
        "marker as a decorator applied to Double and calls Double(test_double) in place of the test, so the test "
        "silently vanishes (or the op runs at import). Write @pytest.mark.autograd_op(op=Double).",
    ])
    assert_no_traceback(result)


def test_positional_plain_function_op_explains_the_import_error(pytester, run_pytest):
    # pytest calls scale(test_scale) at import time; the op fails on a
    # function argument and the module cannot be imported. The report says why.
    pytester.makepyfile(
        """
        import pytest
        import torch

        def scale(x):
            return x * 2.0

        @pytest.mark.autograd_op(scale)
        def test_scale():
            return [(torch.randn(3),)]
        """
    )
    result = run_pytest("--autograd-checks=gradcheck")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*.py:7: @pytest.mark.autograd_op(scale) passes the op positionally. pytest then treats the marker as a "
        "decorator applied to scale and calls scale(the test function) in place of the test*"
        "Write @pytest.mark.autograd_op(op=scale).",
        "*TypeError: unsupported operand type(s) for *: 'function' and 'float'",
    ])


def test_positional_op_in_a_comment_of_a_healthy_module_is_harmless(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch
        from reference_ops import MyReLU

        # Never write:
        # @pytest.mark.autograd_op(MyReLU)
        @pytest.mark.autograd_op(op=MyReLU)
        def test_relu():
            return [(torch.tensor([-1.0, 2.0]),)]
        """
    )
    run_pytest("--autograd-checks=gradcheck").assert_outcomes(passed=1)


# --- the test body: item failures with the fix --------------------------------------------------


def test_bad_test_bodies_fail_with_a_message_naming_the_fix(pytester, run_pytest):
    pytester.makepyfile(
        test_bodies=HEADER + """
@pytest.mark.autograd_op(op=MyReLU)
def test_returns_none():
    x = torch.randn(3)

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_empty_list():
    return []

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_a_string():
    return "samples"

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_numbers():
    return [1.0, 2.0]

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_a_tuple_without_tensors():
    return [(1.0, 2)]

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_numpy_arrays():
    import numpy as np
    return [(np.ones(3),)]

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_a_bare_numpy_array():
    import numpy as np
    return np.ones(3)

@pytest.mark.autograd_op(op=MyReLU)
def test_returns_a_dict():
    return {"x": torch.randn(3)}
"""
    )
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=8)
    where = "test_bodies.py::{}[[]gradcheck-cpu[]]"
    result.stdout.fnmatch_lines_random([
        where.format("test_returns_none") + ": the test body returned None; a test marked autograd_op "
        "must `return` its samples: one tuple of arguments, a Sample, or a list of them.",
        where.format("test_returns_empty_list") + ": the test body returned an empty list: "
        "there are no samples to check.",
        where.format("test_returns_a_string") + ": the test body returned str; return one tuple of "
        "arguments, a Sample, or a list of them.",
        where.format("test_returns_numbers") + ": sample 0 is a float; each sample must be a tuple of the "
        "op's arguments (tensors, numbers or None) or a pytest_autograd.Sample.",
        where.format("test_returns_a_tuple_without_tensors") + ": sample 0 (Sample(1.0, 2)) has no tensor "
        "arguments; a sample is the op's arguments, with at least one torch.Tensor.",
        where.format("test_returns_numpy_arrays") + ": sample 0 argument 0 is a numpy array; pass torch "
        "tensors (torch.from_numpy(array)).",
        where.format("test_returns_a_bare_numpy_array") + ": the test body returned ndarray; return one "
        "tuple of arguments, a Sample, or a list of them.",
        where.format("test_returns_a_dict") + ": the test body returned dict; return one tuple of "
        "arguments, a Sample, or a list of them.",
    ])
    assert_no_traceback(result)


def test_reference_with_the_wrong_signature_names_both_signatures(pytester, run_pytest):
    pytester.makepyfile(
        test_ref=HEADER + """
def linear_without_bias(input, weight):
    return input @ weight.T

@pytest.mark.autograd_op(op=LinearFunction, reference=linear_without_bias)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]
"""
    )
    result = run_pytest("--autograd-checks=reference")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=linear_without_bias(input, weight) does not accept sample 0's 3 positional argument(s): "
        "too many positional arguments. The reference must take the same arguments as the op.",
    ])
    assert_no_traceback(result)


def test_reference_raising_type_error_inside_is_reported_as_a_signature_problem(pytester, run_pytest):
    pytester.makepyfile(
        test_ref=HEADER + """
def reference(*args):
    return torch.nn.functional.linear(*args, 1.0)

@pytest.mark.autograd_op(op=LinearFunction, reference=reference)
def test_linear():
    return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]
"""
    )
    result = run_pytest("--autograd-checks=reference")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "reference=reference cannot be called with sample 0's arguments: *. "
        "The reference must take the same arguments as the op.",
    ])
    assert_no_traceback(result)


def test_an_op_that_raises_is_reported_at_the_users_line_without_a_traceback(pytester, run_pytest):
    pytester.makepyfile(
        test_raising="""
import pytest
import torch

class Broken(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("shape mismatch in my kernel")

    @staticmethod
    def backward(ctx, grad):
        return grad

@pytest.mark.autograd_op(op=Broken)
def test_broken():
    return [(torch.randn(3),)]
"""
    )
    result = run_pytest("--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "the op's forward raised ValueError: shape mismatch in my kernel",
        "  check gradcheck, device cpu, sample 0",
        "  at *test_raising.py:7 in forward",
        "  seed: *",
        '  rerun: pytest "test_raising.py::test_broken[[]gradcheck-cpu[]]" --autograd-seed=0',
    ])
    assert_no_traceback(result)


def test_a_misspelled_marker_fails_its_test_instead_of_a_silent_pass(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.autograd_ops(op=torch.exp)
        def test_exp():
            return (torch.randn(3),)
        """
    )
    result = run_pytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_exp: @pytest.mark.autograd_ops is not a registered marker and looks like a "
                                 "typo of @pytest.mark.autograd_op*"])


def test_an_autograd_function_instance_as_op_names_the_class_to_pass(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest, torch

{double}        @pytest.mark.autograd_op(op=Double())
        def test_double():
            return (torch.randn(3),)
        """.replace("{double}", DOUBLE.lstrip("\n"))
    )
    result = run_pytest("-W", "ignore::DeprecationWarning")  # torch warns that Functions are not instantiated
    result.stdout.fnmatch_lines(["*op=Double() is an instance; pass the autograd.Function class itself: op=Double.*"])
    assert_no_traceback(result)


def test_a_misspelled_check_name_gets_a_suggestion(pytester, run_pytest):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run_pytest("--autograd-checks=gradchek")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown check(s) 'gradchek' (did you mean gradcheck?)*"])


def test_a_flat_list_of_tensors_is_refused_as_ambiguous(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.nn.functional.linear, checks=["gradcheck"])
        def test_linear():
            return [torch.randn(2, 3), torch.randn(4, 3), torch.randn(4)]
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*returned a list of 3 tensors, which is ambiguous; return a tuple*"])


def test_a_body_without_samples_is_reported_once_and_its_other_items_fail_pointing_at_it(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.exp, checks=["gradcheck", "gradgradcheck", "reference"])
        def test_exp():
            x = torch.randn(3)
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=3)
    text = result.stdout.str()
    assert text.count("the test body returned None") == 3
    result.stdout.fnmatch_lines(["*the test body returned None*(same cause as *test_exp[[]gradcheck-cpu[]]: "
                                 "see its full report)"])


def test_a_marker_mistake_fails_only_its_own_test_and_the_session_runs_the_rest(pytester, run_pytest):
    # It was a collection error: pytest stopped the whole session ("Interrupted: 1 error during collection"), so
    # one typo in one test left every other test of a suite unrun.
    pytester.makepyfile(test_ops=HEADER + """
@pytest.mark.autograd_op(op=LinearFunction, referenec=torch.nn.functional.linear)
def test_typo():
    raise AssertionError("the body of a misused test must never run: returning samples, it would pass")


@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
def test_fine():
    return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]


def test_plain():
    pass
""")
    result = run_pytest("--autograd-checks=gradcheck,reference")
    result.assert_outcomes(failed=1, passed=3)
    result.stdout.fnmatch_lines(["*test_typo[[]usage-error[]]*",
                                 "test_ops.py::test_typo: unknown @pytest.mark.autograd_op argument(s) referenec "
                                 "(did you mean reference?)*"])
    assert "the body of a misused test must never run" not in result.stdout.str()
