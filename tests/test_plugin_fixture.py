"""The autograd_check fixture: the same checks and reports, called from inside any test."""

import pytest
import torch


def test_the_fixture_passes_a_correct_op_and_returns_the_outcomes(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops import LinearFunction

        def test_linear(autograd_check):
            x, w, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(2)
            outcomes = autograd_check(LinearFunction, x, w, b, reference=torch.nn.functional.linear,
                                      checks=["gradcheck", "reference", "parity"])
            assert [(o.check, o.device, o.status) for o in outcomes] == [
                ("gradcheck", "cpu", "passed"),
                ("reference", "cpu", "passed"),
                ("parity", "cpu", "skipped"),
            ]
            assert outcomes[2].detail.startswith("parity compares a non-CPU device against CPU")
        """
    )
    run_pytest().assert_outcomes(passed=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_the_fixture_skips_absent_devices_with_the_reason(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops import MyReLU

        def test_relu(autograd_check):
            outcomes = autograd_check(MyReLU, torch.tensor([-1.0, 2.0]), checks=["gradcheck"])
            assert [(o.device, o.status) for o in outcomes] == [("cpu", "passed"), ("cuda", "skipped")]
            assert "CUDA is not available" in outcomes[1].detail
        """
    )
    run_pytest("--autograd-devices=cpu,cuda").assert_outcomes(passed=1)


def test_the_fixture_fails_a_buggy_op_with_the_full_report(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops.buggy import ReLUPositiveGradOnly

        def test_relu(autograd_check):
            x = torch.tensor([[-1.5, 0.5, 2.0], [1.0, -0.25, 3.0]])
            autograd_check(ReLUPositiveGradOnly, x, reference=torch.relu, checks=["gradcheck", "reference"])
            raise AssertionError("not reached: the fixture fails the test")
        """
    )
    result = run_pytest("--autograd-seed=4")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "autograd_check: 2 check(s) failed",
        "",
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "*",
        "gradient w.r.t. `x` from the op differs from the reference",
        "  check reference, device cpu, dtype float64, sample 0",
        "*",
        '  rerun: pytest "test_*.py::test_relu" --autograd-seed=4',
    ])
    assert "not reached" not in result.stdout.str()


def test_the_fixture_reports_usage_mistakes_without_a_traceback(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops import MyReLU

        def test_unknown_check(autograd_check):
            autograd_check(MyReLU, torch.ones(2), checks=["gradchek"])

        def test_unknown_option(autograd_check):
            autograd_check(MyReLU, torch.ones(2), atoll=1e-3)

        def test_not_callable(autograd_check):
            autograd_check("relu", torch.ones(2))

        def test_no_tensor(autograd_check):
            autograd_check(MyReLU, 1.0)
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines_random([
        "autograd_check: unknown check(s) 'gradchek'; known checks are: gradcheck, gradgradcheck, parity, reference*",
        "autograd_check: unknown option(s) atoll; known options are: *atol*",
        "autograd_check: op='relu' is not callable; pass an autograd.Function subclass or a function on tensors",
        "autograd_check: sample 0 (Sample(1.0)) has no tensor arguments; *",
    ])
    assert "Traceback" not in result.stdout.str()


def test_run_checks_works_without_pytest():
    import torch

    from pytest_autograd import run_checks
    from reference_ops import Cube
    from reference_ops.buggy import CubeNotDifferentiableBackward

    good = run_checks(Cube, torch.randn(3), checks=["gradcheck", "gradgradcheck"])
    assert [(o.check, o.status) for o in good] == [("gradcheck", "passed"), ("gradgradcheck", "passed")]
    bad = run_checks(CubeNotDifferentiableBackward, torch.randn(3), checks=["gradcheck", "gradgradcheck"])
    assert [(o.check, o.status) for o in bad] == [("gradcheck", "passed"), ("gradgradcheck", "failed")]
    assert "backward is not differentiable" in bad[1].detail


def test_the_fixture_skips_with_the_reasons_when_every_check_it_ran_was_skipped(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops.buggy import ReLUPositiveGradOnly

        def test_relu(autograd_check):
            autograd_check(ReLUPositiveGradOnly, torch.tensor([-1.0, 2.0]), checks=["reference", "parity"])
            raise AssertionError("not reached: nothing was checked, so the test is skipped")
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_*.py:*: autograd_check: every check was skipped, so nothing "
                                 "was checked: no reference=* (reference-cpu); parity compares a non-CPU device "
                                 "against CPU* (parity-cpu)"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens where CUDA is absent")
def test_the_fixture_states_a_skip_reason_shared_by_many_checks_once(pytester, run_pytest):
    pytester.makepyfile(
        """
        import torch
        from reference_ops import MyReLU

        def test_relu(autograd_check):
            autograd_check(MyReLU, torch.tensor([-1.0, 2.0]), devices=["cuda"])
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    line = next(line for line in result.outlines if line.startswith("SKIPPED"))
    assert line.count("CUDA is not available") == 1, line
    assert "(gradcheck-cuda, gradgradcheck-cuda, parity-cuda, reference-cuda and " in line, line
    assert len(line) < 400, line
