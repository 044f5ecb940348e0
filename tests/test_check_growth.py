"""The growth check fails caches that keep more tensors alive on every call, and passes bounded ones."""

import textwrap


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=growth", *args)


def test_growth_reports_tensors_and_bytes_per_call_of_a_list_on_the_class(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ExpHistoryOnClass

        @pytest.mark.autograd_op(op=ExpHistoryOnClass)
        def test_exp():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*every call leaves more tensors alive: 1 tensor (about 48 bytes) per call over the last 4 of 8 identical "
        "calls",
        "*check growth, device cpu, dtype float32",
        "*tensors created during the calls still alive after call 1..8: 1, 2, 3, 4, 5, 6, 7, 8",
        "*still alive after the last call: 8 tensors, 384 bytes*",
        "*gc.collect() does not free them*",
        "*hint: a cache that grows on every call: bound it (functools.lru_cache(maxsize=...)*never by tensors*",
    ])


def test_growth_fails_an_lru_cache_keyed_by_tensors(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ScaleCachedByTensor

        @pytest.mark.autograd_op(op=ScaleCachedByTensor)
        def test_scale():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*every call leaves more tensors alive: 2 tensors (about 96 bytes) per call*"])


BOUNDED_CACHE = """
import functools, pytest, torch

@functools.lru_cache(maxsize={maxsize})
def doubled(x):
    return x * 2

class ScaleWithBoundedCache(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return doubled(x).clone()     # keyed by the tensor: one entry per call, the last {maxsize} kept

    @staticmethod
    def backward(ctx, grad):
        return grad * 2
"""


def test_growth_passes_a_bounded_cache_that_stops_growing(pytester, run_pytest):
    result = run(pytester, run_pytest, BOUNDED_CACHE.format(maxsize=4) + """
@pytest.mark.autograd_op(op=ScaleWithBoundedCache)
def test_bounded():
    return [(torch.randn(3, 4),)]
""")
    result.assert_outcomes(passed=1)


def test_growth_calls_must_be_an_integer_of_at_least_four(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.exp, growth_calls=2)
        def test_exp():
            return [(torch.randn(3),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*growth_calls= must be an integer of at least 4*got 2.*"])
    assert "Traceback" not in result.stdout.str()


def test_growth_catches_device_memory_kept_per_call_on_cuda_and_passes_a_correct_op_there(pytester, run_pytest):
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytester.makepyfile("""
        import pytest, torch
        from reference_ops import LinearFunction

        class KeepsEveryInput(torch.autograd.Function):
            kept = []

            @staticmethod
            def forward(ctx, x):
                KeepsEveryInput.kept.append(x.detach().clone())
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        @pytest.mark.autograd_op(op=KeepsEveryInput)
        def test_keeps():
            return [(torch.randn(64, 64),)]

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            return [(torch.randn(8, 16), torch.randn(4, 16), torch.randn(4))]
    """)
    result = run_pytest("--autograd-checks=growth", "--autograd-devices=cuda")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*every call leaves more tensors alive: 1 tensor*per call*",
                                 "*more allocated on cuda*"])


def test_growth_fails_a_cache_larger_than_the_first_half_of_the_calls_fills(pytester, run_pytest):
    result = run(pytester, run_pytest, BOUNDED_CACHE.format(maxsize=5) + """
@pytest.mark.autograd_op(op=ScaleWithBoundedCache)
def test_five():
    return [(torch.randn(3, 4),)]

@pytest.mark.autograd_op(op=ScaleWithBoundedCache, growth_calls=10)
def test_five_watched_over_ten_calls():
    return [(torch.randn(3, 4),)]
""")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_five[[]growth-cpu[]] _*",
                                 "every call leaves more tensors alive: 0.5 tensors (about 24 bytes) per call over the "
                                 "last 4 of 8 identical calls"])


def test_growth_passes_a_buffer_kept_between_calls_and_updated_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class ScaleCountingCalls(torch.autograd.Function):
            calls = None     # one tensor made once, then changed in place by every call

            @staticmethod
            def forward(ctx, x):
                if ScaleCountingCalls.calls is None:
                    ScaleCountingCalls.calls = torch.zeros(())
                ScaleCountingCalls.calls.add_(1)
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        @pytest.mark.autograd_op(op=ScaleCountingCalls)
        def test_counting():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=1)


def test_growth_fails_a_list_that_keeps_a_tensor_every_second_call(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ExpHistoryEverySecondCall

        @pytest.mark.autograd_op(op=ExpHistoryEverySecondCall)
        def test_every_second():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*every call leaves more tensors alive: 0.5 tensors*per call over the last 4 of 8*"])
