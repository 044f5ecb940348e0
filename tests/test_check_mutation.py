"""The mutation check fails ops that write into their inputs or grad_output, and passes declared in-place ops."""

import textwrap


def run(pytester, run_pytest, source):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest("--autograd-checks=mutation")


def test_mutation_names_the_argument_forward_changes_without_mark_dirty(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import AddOneInPlaceNoMarkDirty

        @pytest.mark.autograd_op(op=AddOneInPlaceNoMarkDirty)
        def test_add_one():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `x` in place without declaring it: 12 of 12 elements changed",
        "*check mutation, device cpu, dtype float32, sample 0",
        "*argument: x",
        "*worst element: x[[]0, 0[]]: before *, after *",
        "*hint: work on a copy (`x = x.clone()`), or declare the in-place update with ctx.mark_dirty(x)*",
    ])


def test_mutation_fails_a_backward_that_scales_grad_output_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import ScaleMutatesGradOutput

        @pytest.mark.autograd_op(op=ScaleMutatesGradOutput)
        def test_scale():
            return [(torch.randn(5),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward modified its incoming gradient `grad_output` in place: 5 of 5 elements changed",
        "*argument: grad_output",
        "*hint: compute a new tensor (`grad_output * 2`) instead of updating it in place*",
    ])


def test_mutation_names_an_input_a_plain_function_overwrites_and_does_not_return(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        def scaled_copy(x, scratch):
            scratch[:2] = x[:2]   # writes the caller's buffer, returns something else
            return x * 2

        @pytest.mark.autograd_op(op=scaled_copy)
        def test_scaled_copy():
            return [(torch.randn(4), torch.randn(4))]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `scratch` in place without declaring it: 2 of 4 elements changed",
    ])


def test_mutation_passes_declared_in_place_ops_and_clean_backwards(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops import AddOneInPlace, ScaleOnceDifferentiable, SplitHalves, SortWithIndices

        @pytest.mark.autograd_op(op=AddOneInPlace)
        def test_add_one_with_mark_dirty():
            return [(torch.randn(3, 4),)]

        @pytest.mark.autograd_op(op=ScaleOnceDifferentiable)
        def test_scale():
            return [(torch.randn(5),)]

        @pytest.mark.autograd_op(op=SplitHalves)
        def test_split():
            return [(torch.randn(3, 5), 2)]

        @pytest.mark.autograd_op(op=SortWithIndices)
        def test_sort():
            return [(torch.randn(3, 5),)]

        def add_in_place(x, y):
            return x.add_(y)   # returns the tensor it changed: the caller sees the change

        @pytest.mark.autograd_op(op=add_in_place)
        def test_plain_in_place_returning_its_input():
            return [(torch.randn(3), torch.randn(3))]
    """)
    result.assert_outcomes(passed=5)


def test_mutation_names_the_output_a_backward_overwrites(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import ExpBackwardWritesOutput

        @pytest.mark.autograd_op(op=ExpBackwardWritesOutput)
        def test_exp():
            return [(torch.randn(3, 4),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward modified the op's output `output` in place: 12 of 12 elements changed",
        "*output: output",
        "*worst element: output[[]0, 0[]]: before *, after *",
        "*hint: backward must not write to what forward returned*",
    ])


def test_mutation_names_the_saved_tensor_a_backward_overwrites(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class TanhScratchInSaved(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.tanh(x)
                ctx.save_for_backward(y * y)      # an intermediate only backward sees
                return y

            @staticmethod
            def backward(ctx, grad):
                (square,) = ctx.saved_tensors
                return grad * square.neg_().add_(1)   # reuses the saved buffer as scratch

        @pytest.mark.autograd_op(op=TanhScratchInSaved)
        def test_tanh():
            return [(torch.randn(5),)]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward modified the saved tensor `ctx.saved_tensors[[]0[]]` in place: 5 of 5 elements changed",
        "*hint: backward must not write to what forward saved*",
    ])


def test_mutation_names_a_list_argument_forward_changes_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.state import PadDimsReversesPadsInPlace

        @pytest.mark.autograd_op(op=PadDimsReversesPadsInPlace)
        def test_pad():
            return [(torch.randn(2, 3, 4), [1, 2, 0, 3])]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `pads` (a list) in place without declaring it: [[]1, 2, 0, 3[]] -> "
        "[[]0, 3, 1, 2[]]",
        "*argument: pads",
        "*every later call with it gets different values*",
        "*hint: work on a copy (`pads = list(pads)`)*",
    ])


BATCH_NORM = """
    import pytest, torch
    from reference_ops.state import BatchNormTraining

    def samples():
        return [(torch.randn(6, 3), torch.rand(3) + 0.5, torch.randn(3), torch.zeros(3), torch.ones(3))]
"""


def test_mutation_suggests_mutates_for_running_statistics_updated_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, BATCH_NORM + """
    @pytest.mark.autograd_op(op=BatchNormTraining, constants=("running_mean", "running_var"))
    def test_constants_alone_do_not_allow_mutation():
        return samples()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*forward modified its argument `running_mean` in place without declaring it: 3 of 3 elements changed",
        "*argument: running_mean",
        "*declare it on the marker: mutates=(\"running_mean\", \"running_var\") (constants= only says it is not differentiated; "
        "it does not allow changing it)",
    ])


def test_mutation_allows_the_arguments_named_in_mutates_and_no_others(pytester, run_pytest):
    result = run(pytester, run_pytest, BATCH_NORM + """
    import torch.nn.functional as F

    def batch_norm(x, weight, bias, running_mean, running_var):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training=True)

    @pytest.mark.autograd_op(op=BatchNormTraining, constants=("running_mean", "running_var"),
                             mutates=("running_mean", "running_var"))
    def test_declared():
        return samples()

    @pytest.mark.autograd_op(op=batch_norm, constants=("running_mean", "running_var"),
                             mutates=("running_mean", "running_var"))
    def test_torch_batch_norm_declared():
        return samples()

    @pytest.mark.autograd_op(op=BatchNormTraining, constants=("running_mean", "running_var"),
                             mutates=("running_mean",))
    def test_one_undeclared():
        return samples()
    """)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*forward modified its argument `running_var` in place without declaring it*"])


def test_mutates_naming_no_argument_is_a_usage_error(pytester, run_pytest):
    result = run(pytester, run_pytest, BATCH_NORM + """
    @pytest.mark.autograd_op(op=BatchNormTraining, mutates=("running_mena",))
    def test_typo():
        return samples()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*mutates=('running_mena',) names 'running_mena', which is not an argument of the op; its arguments are: "
        "x, weight, bias, running_mean, running_var, momentum, eps.",
    ])
    assert "Traceback" not in result.stdout.str()


def test_a_declared_change_to_a_list_argument_never_reaches_the_next_run(pytester, run_pytest):
    pytester.makepyfile(textwrap.dedent("""
        import pytest, torch

        class ScaleByCallCount(torch.autograd.Function):
            '''Records its calls in the caller's list, and scales by how many it has seen: declared with mutates=.'''

            @staticmethod
            def forward(ctx, x, calls):
                calls.append(len(calls))
                ctx.factor = float(len(calls))
                return x * ctx.factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor, None

        @pytest.mark.autograd_op(op=ScaleByCallCount, mutates=("calls",),
                                 checks=["mutation", "determinism", "reentrancy", "gradcheck"])
        def test_scale():
            return [(torch.randn(3), [])]
    """))
    result = run_pytest()
    result.assert_outcomes(passed=4)


def test_mutation_names_a_list_argument_backward_changes_in_place(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        import torch.nn.functional as F

        class PadLast(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, pads):
                ctx.pads = pads                   # the caller's list
                return F.pad(x, pads)

            @staticmethod
            def backward(ctx, grad):
                before, after = ctx.pads
                ctx.pads.clear()                  # "free" it: empties the caller's list
                return grad[..., before:grad.shape[-1] - after], None

        @pytest.mark.autograd_op(op=PadLast)
        def test_pad():
            return [(torch.randn(3, 4), [1, 2])]
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*backward modified its argument `pads` (a list) in place: [[]1, 2[]] -> [[][]]",
        "*hint: work on a copy (`pads = list(pads)`) instead of changing the caller's list",
    ])


SWIGLU_WRITES_GRADIENTS_INTO_ITS_INPUTS = """
import pytest, torch
from reference_ops.memory_saving import SwiGLUSavesMemory  # backward writes the gradients into a and b


@pytest.mark.autograd_op(op=SwiGLUSavesMemory, checks=["mutation"]{marker})
def test_swiglu():
    return [(torch.randn(4, 6), torch.randn(4, 6))]
"""


def test_a_backward_that_overwrites_its_inputs_fails_saying_how_to_declare_it(pytester, run_pytest):
    pytester.makepyfile(test_ops=SWIGLU_WRITES_GRADIENTS_INTO_ITS_INPUTS.replace("{marker}", ""))
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["backward modified the op's input `a` in place: 24 of 24 elements changed",
                                 "*hint: backward must not write to the op's inputs*or, if it overwrites the input on "
                                 'purpose to save memory, declare it on the marker: mutates=("a",)'])


def test_a_backward_that_overwrites_inputs_declared_with_mutates_passes(pytester, run_pytest):
    pytester.makepyfile(test_ops=SWIGLU_WRITES_GRADIENTS_INTO_ITS_INPUTS.replace("{marker}", ', mutates=("a", "b")'))
    run_pytest().assert_outcomes(passed=1)


MEMORY_SAVING = """
import pytest
from reference_ops.memory_saving import {op}, swiglu_reference, swiglu_samples

@pytest.mark.autograd_op(op={op}, reference=swiglu_reference, mutates=("a", "b"), double_backward=False)
def test_swiglu():
    return swiglu_samples()
"""


def test_a_declared_memory_saving_backward_passes_every_default_check(pytester):
    pytester.makepyfile(test_ops=MEMORY_SAVING.format(op="SwiGLUSavesMemory"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert "failed" not in result.parseoutcomes(), result.stdout.str()


def test_a_memory_saving_backward_with_a_wrong_gradient_fails_gradcheck_for_the_gradient_not_the_writes(pytester):
    pytester.makepyfile(test_ops=MEMORY_SAVING.format(op="SwiGLUSavesMemoryNoSiluTerm"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gradient of output w.r.t. `a` does not match the numerical derivative*"])
    assert "modified by an inplace operation" not in result.stdout.str()


def test_an_undeclared_memory_saving_backward_fails_mutation_and_gradgradcheck_only_each_saying_why():
    from pytest_autograd import Sample, run_checks
    from reference_ops.memory_saving import SwiGLUSavesMemory, swiglu_reference, swiglu_samples

    samples = [Sample(*sample) for sample in swiglu_samples()]
    outcomes = {o.check: o for o in run_checks(SwiGLUSavesMemory, samples=samples, reference=swiglu_reference)}
    failed = sorted(check for check, outcome in outcomes.items() if outcome.status == "failed")
    assert failed == ["gradgradcheck", "mutation"], [(c, outcomes[c].detail) for c in failed]
    assert outcomes["mutation"].detail.startswith("backward modified the op's input `a` in place")
    assert outcomes["gradgradcheck"].detail.startswith(
        "backward is not differentiable: it writes into the op's inputs `a`, `b` in place, which its own gradient "
        "needs")
    assert "declare double_backward=False on the marker" in outcomes["gradgradcheck"].detail
    assert outcomes["noncontiguous"].status == "passed", outcomes["noncontiguous"].detail


def test_run_checks_takes_mutates_like_the_marker_whichever_checks_run():
    from pytest_autograd import Sample, run_checks
    from reference_ops.memory_saving import SwiGLUSavesMemory, swiglu_samples

    samples = [Sample(*sample) for sample in swiglu_samples()]
    outcome, = run_checks(SwiGLUSavesMemory, samples=samples, checks=["noncontiguous"], mutates=("a", "b"))
    assert outcome.status == "passed", outcome.detail


def test_a_backward_writing_its_saved_inputs_through_raw_memory_is_judged_on_its_gradients():
    # A kernel's writes move no version counter: a second backward on the same graph ran on the first one's
    # gradients, and gradcheck reported a wrong gradient ("not linear in grad_output") of a correct kernel.
    import torch

    from pytest_autograd import Sample, run_checks
    from reference_ops.memory_saving import SwiGLUSavesMemoryKernelStyle, swiglu_reference, swiglu_samples

    samples = [Sample(*sample) for sample in swiglu_samples()]
    declared = run_checks(SwiGLUSavesMemoryKernelStyle, samples=samples, reference=swiglu_reference,
                          mutates=("a", "b"), double_backward=False)
    assert [(o.check, o.detail) for o in declared if o.status == "failed"] == []
    low = run_checks(SwiGLUSavesMemoryKernelStyle, samples=samples, checks=["gradcheck", "sizes"],
                     mutates=("a", "b"), dtypes=(torch.float32,))
    assert [(o.check, o.detail) for o in low if o.status == "failed"] == []
    undeclared = {o.check: o for o in run_checks(SwiGLUSavesMemoryKernelStyle, samples=samples,
                                                 reference=swiglu_reference, double_backward=False)}
    assert sorted(c for c, o in undeclared.items() if o.status == "failed") == ["mutation"]
    assert undeclared["mutation"].detail.startswith("backward modified the op's input `a` in place")


def test_a_backward_consuming_a_ctx_attribute_fails_however_the_marker_names_the_op(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class ReluScale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.mask = (x > 0).to(x.dtype) * 2.0
                return x.clamp_min(0) * 2.0

            @staticmethod
            def backward(ctx, grad):
                return ctx.mask.mul_(grad)        # consumes the mask: a second backward is wrong

        def relu_scale(x):                        # how a library exposes it
            return ReluScale.apply(x)

        def relu_scale_then_negated(x):           # more autograd ops after the Function
            return -ReluScale.apply(x)

        @pytest.mark.parametrize("op", [ReluScale, ReluScale.apply, relu_scale, relu_scale_then_negated])
        def test_relu_scale(op, autograd_check):
            autograd_check(op, torch.randn(8, 16), checks=["mutation"])
    """)
    result.assert_outcomes(failed=4)
    assert result.stdout.str().count("backward modified the saved tensor `ctx.mask` in place") == 4
