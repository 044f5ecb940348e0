"""A kernel that crashes the process is a verdict, never the end of the session (engine/exploration).

The ops of reference_ops.crashing read address 0 exactly where a kernel would read out of bounds, so each crash
is certain: on the user's own sample (a failure where every check runs in the sandbox, ``--autograd-isolate=all``;
by default the session's process dies and the sandbox names the item it died in), on the user's own values in another layout (a failure naming
the layout), and on a batch the plugin cut while a box still names its last image (a note, never a failure).
"""

import subprocess
import sys

import pytest

CRASHING = """
import pytest, torch
from reference_ops.crashing import BoxPool, ContiguousGradReader, NullForward, RowGather, StridedGradReader


@pytest.mark.autograd_op(op=NullForward, checks=["gradcheck", "sizes"])
def test_null_forward():
    return [(torch.randn(4, 5),)]


@pytest.mark.autograd_op(op=StridedGradReader, reference=lambda x: 2 * x, checks=["noncontiguous", "gradcheck"])
def test_strided_grad_reader():
    return [(torch.randn(4, 5),)]


@pytest.mark.autograd_op(op=ContiguousGradReader, reference=lambda x: 2 * x)
def test_contiguous_grad_reader():
    return [(torch.randn(4, 5),)]


@pytest.mark.autograd_op(op=BoxPool, constants=("boxes",))
def test_box_pool():
    return [(torch.randn(2, 4, 6), torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 6.0]]))]


@pytest.mark.autograd_op(op=RowGather, reference=lambda x, index: x[index])
def test_row_gather():
    return [(torch.randn(8, 4), torch.tensor([6, 0, 3]))]
"""


def assert_no_failure(result):
    """Every default check ran to a verdict, and none failed (the set of default checks grows; its size is not the
    point here)."""
    outcomes = result.parseoutcomes()
    assert not outcomes.get("failed") and not outcomes.get("error") and outcomes.get("passed", 0) >= 15, outcomes


@pytest.fixture
def crashing(pytester):
    pytester.makepyfile(test_ops=CRASHING)
    return pytester


def test_a_forward_that_crashes_on_the_users_sample_ends_the_session_naming_the_item_and_the_cure(crashing):
    # by default only the checks that explore run in the sandbox: the user's own sample runs in pytest's process.
    # Read through pipes, as a terminal or CI does: the sandbox writes after the session's process is gone
    finished = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "null_forward"],
                              cwd=crashing.path, capture_output=True, text=True, timeout=300)
    assert finished.returncode not in (0, 1, 5), finished.stdout
    assert "pytest-autograd: the test session's process died while running " \
           "test_ops.py::test_null_forward[gradcheck-cpu], without a word of its own: an op's native code crashed " \
           "it there, in pytest's own process. --autograd-isolate=all runs every check in a sandbox process" \
           in finished.stderr, finished.stderr[-3000:]


def test_under_isolate_all_a_forward_that_crashes_on_the_users_sample_fails_each_check_and_the_session_reports(
        crashing):
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "-k", "null_forward", "--junitxml=junit.xml",
                                           "--autograd-isolate=all")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "`NullForward` crashed the process (SIGSEGV) on your sample: its forward reads or writes memory it does not "
        "own",
        "  check gradcheck, device cpu, sample 0",
        "*the session went on*",
        "*it is your own sample*",
        "  crashed at: File *reference_ops/crashing.py*",
    ])
    # one full report per root cause: the other check's item points at it
    result.stdout.fnmatch_lines(["`NullForward` crashed the process (SIGSEGV) on your sample: its forward * (same cause "
                                 "as test_ops.py::test_null_forward[[]gradcheck-cpu[]]: see its full report)"])
    assert (crashing.path / "junit.xml").read_text().count("<testcase") == 2


def test_a_backward_that_crashes_on_a_strided_grad_output_fails_noncontiguous_naming_the_layout(crashing):
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "-k", "strided_grad_reader")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "`StridedGradReader` crashed the process (SIGSEGV) when grad_output is transposed: its backward reads "
        "or writes memory it does not own",
        "  check noncontiguous, device cpu, sample 0",
        "*failed on evidence that the op is meant to work there: these are your own values, in a layout autograd and "
        "real models hand an op",
        "  hint: the kernel reads memory as if the tensor were contiguous*",
    ])


def test_its_correct_twin_passes_every_default_check(crashing):
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "-k", "contiguous_grad_reader and not strided")
    assert_no_failure(result)


def test_ops_that_crash_on_a_batch_cut_under_their_indices_pass_every_default_check_with_a_note(crashing):
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "-k", "box_pool or row_gather", "-rP")
    assert_no_failure(result)
    result.stdout.fnmatch_lines([
        "*sizes: not judged when dim 0 of `features` (size 2 in your sample) is 1: `BoxPool` crashed the process "
        "(SIGSEGV) there, in its forward*; the plugin made that size up, and the op need not accept it*; sizes= on "
        "the marker declares the sizes the op must accept",
        "*sizes: not judged when `x` gets one more leading dim*`RowGather` crashed the process (SIGSEGV) there*",
    ])


def test_crashes_are_judged_alike_under_xdist(crashing):
    pytest.importorskip("xdist")
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 3 and not outcomes.get("error") and outcomes["passed"] > 3
    result.stdout.fnmatch_lines(["*`StridedGradReader` crashed the process (SIGSEGV) when grad_output is "
                                 "transposed*"])


def test_an_op_on_the_marker_that_cannot_be_pickled_is_found_in_the_sandbox_through_the_marker(pytester, run_pytest):
    pytester.makepyfile(test_lambda="""
        import pytest, torch

        @pytest.mark.autograd_op(op=lambda x: (x * 3).sum(-1), reference=lambda x: (3 * x).sum(-1),
                                 checks=["sizes", "noncontiguous"])
        def test_scaled_sum():
            return [(torch.randn(4, 5),)]
    """)
    result = run_pytest("-W", "error::pytest_autograd.engine.notes.AutogradNote")
    result.assert_outcomes(passed=2)


def test_with_isolation_off_every_check_runs_in_the_sessions_process(pytester, run_pytest):
    pytester.makepyfile(test_pid="""
        import os, pytest, torch

        SEEN = set()

        class RecordsItsProcess(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                SEEN.add(os.getpid())
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        @pytest.mark.autograd_op(op=RecordsItsProcess, reference=lambda x: 2 * x, checks=["sizes", "gradcheck"])
        def test_sizes():
            return [(torch.randn(4, 5),)]

        def test_only_this_process_ran_it():
            assert SEEN == {os.getpid()}
    """)
    run_pytest("--autograd-isolate=off").assert_outcomes(passed=3)


def test_with_isolation_all_no_check_runs_the_op_in_the_sessions_process(pytester, run_pytest):
    pytester.makepyfile(test_pid="""
        import os, pytest, torch

        SEEN = set()

        class RecordsItsProcess(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                SEEN.add(os.getpid())
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        @pytest.mark.autograd_op(op=RecordsItsProcess, reference=lambda x: 2 * x,
                                 checks=["gradcheck", "reference", "sizes"])
        def test_checks():
            return [(torch.randn(4, 5),)]

        def test_the_op_never_ran_here():
            assert os.getpid() not in SEEN
    """)
    run_pytest("--autograd-isolate=all").assert_outcomes(passed=4)


def test_an_unknown_isolation_mode_is_a_usage_error_naming_the_modes(pytester, run_pytest):
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = run_pytest("--autograd-isolate=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--autograd-isolate: unknown isolation mode 'sometimes'; use one of explore, all, "
                                 "off*"])


def test_isolate_on_the_marker_is_validated_and_applies_to_that_test(pytester, run_pytest):
    pytester.makepyfile(test_marker="""
        import os, pytest, torch

        SEEN = set()

        def doubled(x):
            SEEN.add(os.getpid())
            return x * 2

        @pytest.mark.autograd_op(op=doubled, reference=lambda x: 2 * x, checks=["sizes"], isolate="off")
        def test_here():
            return [(torch.randn(4, 5),)]

        @pytest.mark.autograd_op(op=doubled, checks=["gradcheck"], isolate="never")
        def test_misspelt():
            return [(torch.randn(4, 5),)]

        def test_sizes_ran_here():
            assert os.getpid() in SEEN
    """)
    result = run_pytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*isolate=: unknown isolation mode 'never'; use one of explore, all, off*"])


def test_a_model_whose_kernel_crashes_at_a_batch_of_one_is_scanned_and_the_session_reports(pytester):
    pytester.makepyfile(test_model="""
        import pytest, torch
        from reference_ops.crashing import BatchOfOneModel

        @pytest.mark.autograd_model(checks=["gradcheck", "sizes"])
        def test_model():
            return BatchOfOneModel(), (torch.randn(3, 4),)

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*sizes: the model was not run with size 3 of its inputs made 1: it crashed the sandbox "
                                 "process (SIGSEGV) there, at File *reference_ops/crashing.py*; the session went on*"])


def test_extreme_on_an_op_that_crashes_on_every_call_is_skipped_saying_so_never_passed(crashing):
    crashing.makepyfile(test_extreme="""
        import pytest, torch
        from reference_ops.crashing import NullForward

        @pytest.mark.autograd_op(op=NullForward, reference=lambda x: 2 * x, checks=["extreme"])
        def test_null_forward_at_every_magnitude():
            return [(torch.randn(4, 5),)]
    """)
    result = crashing.runpytest_subprocess("-p", "no:cacheprovider", "test_extreme.py", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no magnitude could be judged: the op crashed the process at max |x| = *"])
