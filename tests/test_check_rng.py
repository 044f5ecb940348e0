"""The rng check fails ops that reset, reseed or rewind torch's global random number generator."""

import textwrap


def run(pytester, run_pytest, source):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=rng")


def test_rng_fails_a_forward_that_calls_manual_seed(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import NoisyScaleReseedsGlobalRng

        @pytest.mark.autograd_op(op=NoisyScaleReseedsGlobalRng)
        def test_noisy_scale():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward resets torch's global random number generator: the CPU generator's state after forward is the "
        "same whichever state it started from",
        "*check rng, device cpu, dtype float32, sample 0",
        "*started from two different states*every random draw after the op repeats from call to call",
        "*hint: draw from a generator of your own*fork_rng*",
    ])


SOURCE = """
    import pytest, torch

    class BackwardReseeds(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            torch.manual_seed(0)
            return grad * 2

    class SeedsFromTheClock(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            torch.seed()
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    class RewindsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.state = torch.get_rng_state()
            mask = (torch.rand_like(x) > 0.5).to(x.dtype)
            ctx.save_for_backward(mask)
            return x * mask

        @staticmethod
        def backward(ctx, grad):
            torch.set_rng_state(ctx.state)   # meant to recompute the mask, but never restores the state
            (mask,) = ctx.saved_tensors
            return grad * mask

    @pytest.mark.autograd_op(op=BackwardReseeds)
    def test_backward_reseeds():
        return [(torch.randn(5),)]

    @pytest.mark.autograd_op(op=SeedsFromTheClock)
    def test_seeds_from_the_clock():
        return [(torch.randn(5),)]

    @pytest.mark.autograd_op(op=RewindsInBackward)
    def test_rewinds():
        return [(torch.randn(5),)]
"""


def test_rng_names_the_phase_and_the_way_the_generator_is_overwritten(pytester, run_pytest):
    result = run(pytester, run_pytest, SOURCE)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines_random([
        "*backward resets torch's global random number generator*",
        "*forward reseeds torch's global random number generator from outside torch*differs between two runs that "
        "started from the same state",
        "*backward rewinds torch's global random number generator: it leaves the CPU generator in the state it had "
        "before forward*",
    ])


def test_rng_passes_ops_that_draw_or_use_their_own_generator_or_fork_it(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import NoisyScaleOwnGenerator

        class RecomputesUnderForkRng(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.state = torch.get_rng_state()
                return x * (torch.rand_like(x) > 0.5).to(x.dtype)

            @staticmethod
            def backward(ctx, grad):
                with torch.random.fork_rng():
                    torch.set_rng_state(ctx.state)
                    mask = (torch.rand_like(grad) > 0.5).to(grad.dtype)
                return grad * mask

        @pytest.mark.autograd_op(op=NoisyScaleOwnGenerator)
        def test_own_generator():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=RecomputesUnderForkRng)
        def test_fork_rng():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
        def test_dropout():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(passed=3)


def test_rng_passes_correct_ops_on_cuda_and_catches_a_reseeding_forward_there(pytester, run_pytest):
    """A CUDA generator moves in whole Philox steps per launch: the check's two starting states must still differ."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytester.makepyfile(textwrap.dedent("""
        import pytest, torch
        from reference_ops import LinearFunction

        class ReseedsCuda(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                torch.cuda.manual_seed(0)
                return x * (torch.rand_like(x) > 0.5).to(x.dtype)

            @staticmethod
            def backward(ctx, grad):
                return grad

        @pytest.mark.autograd_op(op=LinearFunction)
        def test_linear():
            return [(torch.randn(3, 4), torch.randn(2, 4), torch.randn(2))]

        @pytest.mark.autograd_op(op=lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
        def test_dropout():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=ReseedsCuda)
        def test_reseeds():
            return [(torch.randn(3, 4),)]
    """))
    result = run_pytest("--autograd-checks=rng", "--autograd-devices=cuda")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*forward resets torch's global random number generator: the CUDA generator of "
                                 "cuda:0's state after forward is the same whichever state it started from"])
