"""One marked test becomes one item per check and device, filtered by options, marker and ini."""

import pytest
import torch

LINEAR_TEST = """
import pytest
import torch
from reference_ops import LinearFunction

@pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear{marker_extra})
def test_linear():
    return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]
"""


def collected_ids(run_pytest, *args):
    result = run_pytest("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def linear_test(pytester, marker_extra=""):
    pytester.makepyfile(test_ops=LINEAR_TEST.format(marker_extra=marker_extra))


def test_each_check_and_device_becomes_its_own_item(pytester, run_pytest):
    linear_test(pytester)
    ids = collected_ids(run_pytest, "--autograd-checks=gradcheck,parity", "--autograd-devices=cpu,cuda")
    assert ids == [
        "test_linear[gradcheck-cpu]",
        "test_linear[gradcheck-cuda]",
        "test_linear[parity-cpu]",
        "test_linear[parity-cuda]",
    ]


def test_items_follow_the_builtin_check_order_not_the_command_line_order(pytester, run_pytest):
    linear_test(pytester)
    ids = collected_ids(run_pytest, "--autograd-checks=reference,gradgradcheck,gradcheck")
    assert ids == ["test_linear[gradcheck-cpu]", "test_linear[gradgradcheck-cpu]", "test_linear[reference-cpu]"]


def test_without_a_filter_every_registered_check_gets_an_item(pytester, run_pytest):
    linear_test(pytester)
    ids = collected_ids(run_pytest)
    for name in ("gradcheck", "gradgradcheck", "parity", "reference"):
        assert f"test_linear[{name}-cpu]" in ids


def test_unmarked_tests_are_left_alone(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest

        def test_plain():
            pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_parametrized(n):
            pass
        """
    )
    assert collected_ids(run_pytest, "--autograd-devices=cpu,cuda") == [
        "test_plain", "test_parametrized[1]", "test_parametrized[2]"]


def test_marker_checks_keeps_only_the_named_checks(pytester, run_pytest):
    linear_test(pytester, ', checks=["reference", "gradcheck"]')
    assert collected_ids(run_pytest) == ["test_linear[gradcheck-cpu]", "test_linear[reference-cpu]"]


def test_marker_checks_accepts_a_single_name(pytester, run_pytest):
    linear_test(pytester, ', checks="reference"')
    assert collected_ids(run_pytest) == ["test_linear[reference-cpu]"]


def test_marker_checks_and_the_command_line_filter_intersect(pytester, run_pytest):
    linear_test(pytester, ', checks=["reference", "gradcheck"]')
    assert collected_ids(run_pytest, "--autograd-checks=gradcheck,parity") == ["test_linear[gradcheck-cpu]"]


def test_marker_skip_drops_the_named_checks(pytester, run_pytest):
    linear_test(pytester, ', skip=["gradgradcheck", "parity"]')
    ids = collected_ids(run_pytest, "--autograd-checks=gradcheck,gradgradcheck,parity,reference")
    assert ids == ["test_linear[gradcheck-cpu]", "test_linear[reference-cpu]"]


def test_marker_devices_replace_the_configured_devices(pytester, run_pytest):
    linear_test(pytester, ', devices=["cpu", "cuda"]')
    ids = collected_ids(run_pytest, "--autograd-checks=gradcheck")
    assert ids == ["test_linear[gradcheck-cpu]", "test_linear[gradcheck-cuda]"]


def test_marker_devices_accepts_a_comma_separated_string(pytester, run_pytest):
    linear_test(pytester, ', devices="cuda"')
    assert collected_ids(run_pytest, "--autograd-checks=gradcheck", "--autograd-devices=cpu") == [
        "test_linear[gradcheck-cuda]"]


def test_users_own_parametrize_combines_with_check_and_device(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch
        from reference_ops import LinearFunction

        @pytest.mark.parametrize("batch", [2, 3])
        @pytest.mark.autograd_op(op=LinearFunction, reference=torch.nn.functional.linear)
        def test_linear(batch):
            x = torch.randn(batch, 4)
            return [(x, torch.randn(5, 4), None)]
        """
    )
    assert collected_ids(run_pytest, "--autograd-checks=gradcheck,reference") == [
        "test_linear[gradcheck-cpu-2]",
        "test_linear[reference-cpu-2]",
        "test_linear[gradcheck-cpu-3]",
        "test_linear[reference-cpu-3]",
    ]
    result = run_pytest("--autograd-checks=gradcheck,reference")
    result.assert_outcomes(passed=4)


def test_the_body_gets_fixtures_parameters_and_autograd_device(pytester, run_pytest):
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def width():
            return 6
        """
    )
    pytester.makepyfile(
        """
        import pytest
        import torch
        from reference_ops import LinearFunction

        SEEN = []

        @pytest.mark.parametrize("batch", [2])
        @pytest.mark.autograd_op(op=LinearFunction, checks=["gradcheck", "reference"],
                                 reference=torch.nn.functional.linear)
        def test_linear(batch, width, autograd_device, request):
            SEEN.append((request.node.name, batch, width, autograd_device))
            return [(torch.randn(batch, width), torch.randn(4, width), torch.randn(4))]

        def test_seen_everything():
            assert ("test_linear[gradcheck-cpu-2]", 2, 6, "cpu") in SEEN
            assert ("test_linear[reference-cpu-2]", 2, 6, "cpu") in SEEN
        """
    )
    run_pytest().assert_outcomes(passed=3)


def test_autograd_device_outside_a_marked_test_is_the_first_configured_device(pytester, run_pytest):
    pytester.makepyfile(
        """
        def test_device(autograd_device):
            assert autograd_device == "cuda:1"
        """
    )
    run_pytest("--autograd-devices=cuda:1,cpu").assert_outcomes(passed=1)


def test_marked_methods_of_a_test_class_expand_too(pytester, run_pytest):
    pytester.makepyfile(
        """
        import pytest
        import torch
        from reference_ops import MyReLU

        class TestReLU:
            @pytest.mark.autograd_op(op=MyReLU, reference=torch.relu)
            def test_relu(self):
                return [(torch.tensor([-1.5, 0.5, 2.0]),)]
        """
    )
    result = run_pytest("--autograd-checks=gradcheck,reference", "-v")
    result.stdout.fnmatch_lines(["*TestReLU::test_relu[[]gradcheck-cpu[]] PASSED*",
                                 "*TestReLU::test_relu[[]reference-cpu[]] PASSED*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_absent_device_items_are_skipped_saying_cuda_is_not_available(pytester, run_pytest):
    linear_test(pytester)
    result = run_pytest("--autograd-devices=cpu,cuda", "--autograd-checks=gradcheck,reference", "-rs")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "warning: device 'cuda' was asked for but CUDA is not available*: none of its items ran "
        "(--autograd-require-devices makes an absent device an error)",
        "SKIPPED [[]2[]] test_ops.py:* device 'cuda' was asked for but CUDA is not available*",
    ])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
@pytest.mark.parametrize("how", [["--autograd-require-devices"], ["-o", "autograd_require_devices=true"]],
                         ids=["option", "ini"])
def test_require_devices_makes_a_gpu_job_on_a_cpu_machine_a_usage_error(pytester, run_pytest, how):
    linear_test(pytester)
    result = run_pytest("--autograd-devices=cpu,cuda", *how)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--autograd-require-devices: device 'cuda' was asked for but CUDA is not "
                                 "available*drop it from --autograd-devices*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_require_devices_fails_the_items_of_a_marker_device_that_is_absent(pytester, run_pytest):
    linear_test(pytester, marker_extra=', devices=["cpu", "cuda"], checks=["gradcheck"]')
    result = run_pytest("--autograd-require-devices")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_linear[[]gradcheck-cuda[]] _*",
                                 "device 'cuda' was asked for but CUDA is not available*(--autograd-require-devices "
                                 "makes an absent device an error)"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_session_summary_tabulates_checks_by_device(pytester, run_pytest):
    linear_test(pytester)
    result = run_pytest("--autograd-devices=cpu,cuda", "--autograd-checks=gradcheck,reference")
    result.stdout.fnmatch_lines([
        "*= autograd checks =*",
        "check * cpu * cuda*",
        "gradcheck * 1 passed * 1 skipped",
        "reference * 1 passed * 1 skipped",
    ])


def test_ini_twins_in_pyproject_set_devices_checks_and_seed(pytester, run_pytest):
    linear_test(pytester)
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        autograd_devices = "cpu,cuda"
        autograd_checks = "gradcheck,reference"
        autograd_seed = "7"
        """
    )
    result = run_pytest("--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "*test_linear[[]gradcheck-cpu[]]",
        "*test_linear[[]gradcheck-cuda[]]",
        "*test_linear[[]reference-cpu[]]",
        "*test_linear[[]reference-cuda[]]",
        "4 tests collected*",
    ])
    run_pytest("--collect-only").stdout.fnmatch_lines(["autograd: devices=cpu,cuda checks=gradcheck,reference seed=7"])


def test_ini_twins_in_pytest_ini_work_and_the_command_line_wins(pytester, run_pytest):
    linear_test(pytester)
    pytester.makeini(
        """
        [pytest]
        autograd_devices = cuda
        autograd_checks = parity
        autograd_seed = 3
        """
    )
    run_pytest("--collect-only").stdout.fnmatch_lines(["autograd: devices=cuda checks=parity seed=3"])
    assert collected_ids(run_pytest) == ["test_linear[parity-cuda]"]
    result = run_pytest("--collect-only", "--autograd-devices=cpu", "--autograd-checks=gradcheck",
                 "--autograd-seed=11")
    result.stdout.fnmatch_lines(["autograd: devices=cpu checks=gradcheck seed=11", "*test_linear[[]gradcheck-cpu[]]*"])


def test_duplicate_devices_are_collapsed(pytester, run_pytest):
    linear_test(pytester)
    assert collected_ids(run_pytest, "--autograd-checks=gradcheck", "--autograd-devices=cpu, cpu ,cuda") == [
        "test_linear[gradcheck-cpu]", "test_linear[gradcheck-cuda]"]


def test_disjoint_check_selections_skip_with_a_reason(run_pytest, pytester):
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.exp, checks=["gradcheck"])
        def test_exp():
            return (torch.randn(3),)
        """
    )
    result = run_pytest("--autograd-checks=parity", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no check selected*leave none to run*"])
