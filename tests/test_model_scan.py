"""autograd_model and autograd_scan: every custom op a model runs is found and checked on the arguments it got."""

import inspect
import textwrap

import pytest
import torch

from pytest_autograd import autograd_scan
from pytest_autograd.engine.case import Sample
from pytest_autograd.engine.model_capture import ModelRaised, capture_model
from pytest_autograd.engine.model_ops import group_calls
from pytest_autograd.engine.model_scan import NothingToCheck
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.triton_interpreter import interpreter_on
from reference_ops import model as shipped
from reference_ops.functions import ElementwiseMul, LinearFunction, MyReLU
from reference_ops.buggy import LinearWeightGradTransposed

SMALL = "hidden=8, heads=2, inner=12, layers=2"

# The shipped model's RMSNorm is a Triton kernel: on CPU tensors it runs only in Triton's interpreter, which
# tests/conftest.py turns on where there is no GPU
runs_the_shipped_model_on_cpu = pytest.mark.skipif(
    not interpreter_on(), reason="the shipped model's Triton kernel runs on CPU tensors only in Triton's "
                                 "interpreter (TRITON_INTERPRET=1, set by tests/conftest.py where there is no GPU)")


def line_of(function, text):
    """The line number of the first line of ``function``'s source holding ``text``."""
    lines, start = inspect.getsourcelines(function)
    return start + next(k for k, line in enumerate(lines) if text in line)


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return run_pytest(*args)


# ---------------------------------------------------------------------------
# The shipped model
# ---------------------------------------------------------------------------


@runs_the_shipped_model_on_cpu
def test_the_scan_of_the_shipped_model_finds_every_op_passes_the_correct_ones_and_names_the_planted_one(
        pytester, run_pytest):
    result = run(pytester, run_pytest, f"""
        import pytest
        from reference_ops.model import TinyTransformer, model_inputs

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_planted():
            return TinyTransformer({SMALL}, extension=False, planted_bug=True), model_inputs(length=3, hidden=8)

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_correct():
            return TinyTransformer({SMALL}, extension=False), model_inputs(length=3, hidden=8)
    """, "-rA")
    result.assert_outcomes(passed=1, failed=1)
    planted = line_of(shipped.MLP.forward, "LinearWeightGradTransposed.apply")
    result.stdout.fnmatch_lines([
        f"*gradcheck-cpu: 6 ops checked, 1 wrong: `LinearWeightGradTransposed` at *reference_ops/model.py:{planted} "
        "(gradcheck)",
        f"`LinearWeightGradTransposed` at *reference_ops/model.py:{planted}, in blocks.1.mlp: 1 call, 1 signature, "
        "1 checked: failed",
        "  checked at input[[]2, 3, 12[]] float32, weight[[]8, 12[]] float32, bias[[]8[]] float32",
        "    gradcheck-cpu failed: gradient of output w.r.t. `weight` does not match the numerical derivative",
    ])
    result.stdout.fnmatch_lines_random([
        "`TritonRMSNorm` at *reference_ops/model.py:*, in blocks.0.attention_norm: 5 calls, 1 signature, 1 checked: "
        "passed",
        "`LinearFunction` at *reference_ops/model.py:*: * calls, 4 signatures, 4 checked: passed",
        "`MyReLU` at *reference_ops/model.py:*, in blocks.0.mlp: 2 calls, 1 signature, 1 checked: passed",
        "`ElementwiseMul` at *reference_ops/model.py:* (and 1 other site), in *: 3 calls, 2 signatures, 2 checked: "
        "passed",
        "`MulConstant` at *reference_ops/model.py:*, in blocks.0.attention: 2 calls, 1 signature, 1 checked: passed",
        "gradcheck-cpu: 5 ops checked, none wrong",
    ])


@runs_the_shipped_model_on_cpu
@pytest.mark.slow
def test_the_scan_finds_the_c_extension_operator_where_it_builds():
    from reference_ops import extension_available

    if not extension_available():
        pytest.skip("the C++ extension cannot be built here")
    model = shipped.TinyTransformer(hidden=8, heads=2, inner=12, layers=1, extension=True)
    result = autograd_scan(model, *shipped.model_inputs(length=3, hidden=8), checks=["gradcheck", "opcheck"])
    verdicts = {verdict.name: verdict for verdict in result.verdicts}
    extension = verdicts["autograd_ext::linear_forward"]
    assert extension.status == "passed", extension.render()
    assert [o.status for o in extension.outcomes] == ["passed", "passed"], extension.render()
    assert extension.scanned.site.endswith(f"reference_ops/model.py:{line_of(shipped.Attention.forward, 'autograd_ext')}")


@runs_the_shipped_model_on_cpu
def test_the_shipped_model_in_bfloat16_passes_its_correct_ops_and_still_fails_the_planted_one():
    model = shipped.TinyTransformer(hidden=8, heads=2, inner=12, layers=2, extension=False, planted_bug=True)
    model = model.to(torch.bfloat16)
    result = autograd_scan(model, *shipped.model_inputs(length=3, hidden=8, dtype=torch.bfloat16),
                           checks=["gradcheck", "noncontiguous", "determinism"])
    assert [v.name for v in result.wrong] == ["LinearWeightGradTransposed"], result.render()
    assert {v.name for v in result.passed} == {"TritonRMSNorm", "LinearFunction", "MyReLU", "ElementwiseMul",
                                               "MulConstant"}, result.render()
    assert "bfloat16" in result.wrong[0].checked[0].text


# ---------------------------------------------------------------------------
# What is captured
# ---------------------------------------------------------------------------


@torch.library.custom_op("model_scan_tests::scale", mutates_args=())
def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


def _scale_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _scale_backward(ctx, grad):
    x, w = ctx.saved_tensors
    return grad * w, (grad * x).sum(0)


scale.register_autograd(_scale_backward, setup_context=_scale_setup)

_LIBRARY = torch.library.Library("model_scan_tests_composite", "DEF")
_LIBRARY.define("sine_twice(Tensor x) -> Tensor")
_LIBRARY.impl("sine_twice", lambda x: x.sin() * 2, "CompositeImplicitAutograd")


class Doubler(torch.autograd.Function):
    """Calls a custom op inside its forward: the op is its implementation, not a call of the model."""

    @staticmethod
    def forward(ctx, x):
        return scale(x, torch.full_like(x[0], 2.0))

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


doubled = Doubler.apply  # an alias taken at import time, the way libraries expose their Functions


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))
        self.frozen = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)

    def forward(self, x):
        x = doubled(x)
        x = torch.ops.model_scan_tests_composite.sine_twice(x)
        with torch.no_grad():
            doubled(x)
        return LinearFunction.apply(scale(x, self.weight), self.frozen)


def test_the_capture_sees_aliases_custom_ops_and_composite_ops_but_not_an_ops_own_implementation():
    x = torch.randn(3, 4, requires_grad=True)
    capture = capture_model(Mixed(), [Sample(x)])
    ops = {op.name: op for op in group_calls(capture.calls)}
    assert list(ops) == ["Doubler", "model_scan_tests_composite::sine_twice", "model_scan_tests::scale",
                         "LinearFunction"]
    assert ops["Doubler"].calls == 2  # the call under no_grad too, but not the custom op inside its forward
    assert ops["Doubler"].signatures[0].describe(ops["Doubler"].arg_names) == "x[3, 4] float32"
    linear = ops["LinearFunction"]
    assert linear.signatures[0].describe(linear.arg_names) == "input[3, 4] float32, weight[4, 4] float32 constant"
    here = line_of(Mixed.forward, "LinearFunction.apply")
    assert linear.site.endswith(f"test_model_scan.py:{here}")
    assert x.grad is None and capture.backward == "ran"


def test_a_layer_repeated_many_times_keeps_one_copy_of_its_arguments_and_a_dict_output_is_differentiated():
    weight = torch.nn.Parameter(torch.randn(4, 4))

    def deep(x):
        for _ in range(10):
            x = LinearFunction.apply(x, weight)
        return {"logits": x, "extra": [x.sum()]}

    capture = capture_model(deep, [Sample(torch.randn(3, 4))])
    (op,) = group_calls(capture.calls)
    assert op.calls == 10 and len(op.signatures) == 1
    assert sum(call.kept for call in capture.calls) == 2  # the first layer's input is data, the others' are not
    assert op.signatures[0].call.grad_slots == {0, 1}
    assert capture.backward == "ran" and weight.grad is None


def test_a_call_under_no_grad_checks_every_argument_as_a_constant():
    x = torch.randn(3, 4, requires_grad=True)

    def inference(x):
        with torch.no_grad():
            return doubled(x) + 1

    (call,) = capture_model(inference, [Sample(x)]).calls
    assert call.grad_slots == frozenset()


def test_the_function_classes_are_restored_after_the_capture():
    before = Doubler.__dict__["forward"]
    capture_model(Mixed(), [Sample(torch.randn(3, 4))])
    assert Doubler.__dict__["forward"] is before
    assert "forward" not in LinearWeightGradTransposed.__dict__ or \
        LinearWeightGradTransposed.__dict__["forward"].__func__.__qualname__.startswith("LinearWeightGradTransposed")


def test_a_checkpointed_forward_is_captured_with_the_gradients_its_recomputation_needs():
    from torch.utils.checkpoint import checkpoint

    weight = torch.nn.Parameter(torch.randn(4))

    def model(x):
        return checkpoint(lambda t: scale(MyReLU.apply(t), weight), x, use_reentrant=True)

    x = torch.randn(3, 4, requires_grad=True)
    ops = {op.name: op for op in group_calls(capture_model(model, [Sample(x)]).calls)}
    assert ops["MyReLU"].signatures[0].call.grad_slots == {0}
    assert ops["model_scan_tests::scale"].signatures[0].call.grad_slots == {0, 1}
    assert x.grad is None and weight.grad is None


def test_a_function_patched_into_a_model_class_by_a_library_is_found_at_the_patch():
    class Norm(torch.nn.Module):
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    def patched_forward(self, x):  # what apply_..._kernel_to_...() functions install
        return ElementwiseMul.apply(x, x)

    original = Norm.forward
    Norm.forward = patched_forward
    try:
        capture = capture_model(torch.nn.Sequential(Norm(), Norm()), [Sample(torch.randn(2, 3))])
    finally:
        Norm.forward = original
    (op,) = group_calls(capture.calls)
    assert op.name == "ElementwiseMul" and op.calls == 2 and op.modules == ["0", "1"]
    assert op.site.endswith(f"test_model_scan.py:{line_of(patched_forward, 'ElementwiseMul')}")


# ---------------------------------------------------------------------------
# Checking: constants, signatures, selection, options
# ---------------------------------------------------------------------------


class RotaryScale(torch.autograd.Function):
    """``x * table``: like RoPE's tables, ``table`` is a buffer, and backward gives it no gradient."""

    @staticmethod
    def forward(ctx, x, table):
        ctx.save_for_backward(table)
        return x * table

    @staticmethod
    def backward(ctx, grad):
        (table,) = ctx.saved_tensors
        return grad * table, None


class WithTable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.rand(3, 4) + 0.5)
        self.weight = torch.nn.Parameter(torch.randn(5, 4))

    def forward(self, x):
        return LinearFunction.apply(RotaryScale.apply(x, self.table), self.weight)


def test_a_buffer_argument_stays_a_constant_so_a_function_giving_it_no_gradient_passes():
    result = autograd_scan(WithTable(), torch.randn(3, 4, requires_grad=True), checks=["gradcheck", "gradgradcheck"])
    assert not result.wrong, result.render()
    rotary = next(v for v in result.verdicts if v.name == "RotaryScale")
    assert rotary.checked[0].text == "x[3, 4] float32, table[3, 4] float32 constant"
    assert [o.status for o in rotary.outcomes] == ["passed", "passed"]


def test_an_op_called_at_several_shapes_is_checked_at_each_up_to_max_signatures():
    model = WithTable()
    calls = [(torch.randn(*shape, requires_grad=True),) for shape in ((3, 4), (2, 3, 4), (1, 3, 4))]
    result = autograd_scan(model, calls=calls, checks=["gradcheck"], max_signatures=2, ops=["LinearFunction"])
    (linear,) = result.verdicts
    assert linear.headline().endswith("3 calls, 3 signatures, 2 checked, 1 not (max_signatures=)")
    assert [c.text for c in linear.checked] == ["input[3, 4] float32, weight[5, 4] float32",
                                                "input[2, 3, 4] float32, weight[5, 4] float32"]


def test_ops_and_skip_ops_select_by_name_or_object_and_an_op_that_did_not_run_is_named_with_those_that_did():
    x = torch.randn(3, 4)
    by_name = autograd_scan(WithTable(), x, checks=["gradcheck"], ops="RotaryScale")
    by_object = autograd_scan(Mixed(), x, checks=["gradcheck"], ops=[scale], skip_ops=[])
    skipped = autograd_scan(Mixed(), x, checks=["gradcheck"], skip_ops=[Doubler, "model_scan_tests_composite::sine_twice",
                                                                        "LinearFunction"])
    assert [v.name for v in by_name.verdicts] == ["RotaryScale"]
    assert [v.name for v in by_object.verdicts] == ["model_scan_tests::scale"]
    assert [v.name for v in skipped.verdicts] == ["model_scan_tests::scale"]
    with pytest.raises(UsageProblem, match=r"ops= names 'FusedSwiGLU', which did not run in the model's forward; "
                                           r"the custom ops that ran are: `RotaryScale`, `LinearFunction`"):
        autograd_scan(WithTable(), x, ops=["FusedSwiGLU"])


def test_op_options_give_one_op_a_reference_and_a_whole_model_reference_is_refused():
    result = autograd_scan(WithTable(), torch.randn(3, 4), checks=["reference"],
                           op_options={RotaryScale: {"reference": torch.mul}})
    statuses = {v.name: v.status for v in result.verdicts}
    assert statuses == {"RotaryScale": "passed", "LinearFunction": "skipped"}, result.render()
    with pytest.raises(UsageProblem, match=r"reference= applies to one op, not to a whole model; give it for that "
                                           r"op: op_options="):
        autograd_scan(WithTable(), torch.randn(3, 4), reference=torch.mul)


def test_an_op_that_accepts_only_bfloat16_is_judged_in_bfloat16_and_its_wrong_twin_still_fails():
    class Bf16Square(torch.autograd.Function):
        bug = 1.0

        @classmethod
        def check(cls, x):
            if x.dtype != torch.bfloat16:
                raise TypeError(f"only bfloat16 is supported, got {x.dtype}")

        @staticmethod
        def forward(ctx, x):
            Bf16Square.check(x)
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            Bf16Square.check(x)
            return grad * 2 * x * Bf16Square.bug

    x = torch.randn(4, 3).to(torch.bfloat16).requires_grad_()
    good = autograd_scan(Bf16Square.apply, x, checks=["gradcheck"])
    assert [v.status for v in good.verdicts] == ["passed"], good.render()
    checked = good.verdicts[0].checked[0]
    said = checked.notes + [o.detail for o in checked.outcomes if o.status == "passed"]
    assert any("judged by central differences in bfloat16" in text for text in said), good.render()
    Bf16Square.bug = 0.5
    bad = autograd_scan(Bf16Square.apply, x, checks=["gradcheck"])
    assert [v.status for v in bad.verdicts] == ["failed"], bad.render()


def test_an_op_the_model_ran_on_another_device_type_is_skipped_there_not_moved():
    from pytest_autograd.engine.model_capture import CapturedCall
    from pytest_autograd.engine.model_scan import check_ops

    call = CapturedCall(MyReLU, "reference_ops.functions.MyReLU", (torch.randn(3, device="meta"),), {},
                        frozenset({0}), "model.py:1")
    (verdict,) = check_ops(group_calls([call]), ["gradcheck"], devices=["cpu"])
    assert verdict.status == "skipped"
    assert verdict.skip_reason().startswith("the model ran this op on meta, not on cpu: a kernel written for one "
                                            "device may not run on another")


class BackwardRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward kernel not built for this shape")


def test_a_backward_that_raises_is_noted_and_the_op_is_named_by_its_own_check():
    result = autograd_scan(lambda x: MyReLU.apply(BackwardRaises.apply(x)), torch.randn(3, 4, requires_grad=True),
                           checks=["gradcheck"])
    assert [v.name for v in result.wrong] == ["BackwardRaises"], result.render()
    assert result.all_notes()[0].startswith("the model's backward raised RuntimeError: backward kernel not built "
                                            "for this shape")
    assert "the op's backward raised RuntimeError" in result.wrong[0].outcomes[0].detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_that_compute_in_float32_with_a_kernel_backward_pass_every_default_check(dtype):
    from reference_ops.fused import FusedBlock

    block = FusedBlock().to(dtype)
    result = autograd_scan(block, torch.randn(2, 3, 8, dtype=dtype, requires_grad=True))
    assert [v.name for v in result.passed] == ["FusedRMSNorm", "FusedSwiGLU"], result.render()
    norm = result.passed[0]
    assert any("its float64 outputs are all exactly float32 numbers: it computes in float32" in note
               for note in norm.checked[0].notes), norm.render()
    (second,) = [o for o in norm.outcomes if o.check == "gradgradcheck"]
    assert second.status == "skipped"
    assert "its backward returns gradients with no graph behind them (a kernel, or detached tensors)" in second.detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_wrong_fused_kernel_still_fails_when_judged_in_float32(dtype):
    from reference_ops.fused import FusedBlock, FusedRMSNormNoRstdTerm

    block = FusedBlock(norm=FusedRMSNormNoRstdTerm).to(dtype)
    result = autograd_scan(block, torch.randn(2, 3, 8, dtype=dtype, requires_grad=True), checks=["gradcheck"])
    assert [v.name for v in result.wrong] == ["FusedRMSNormNoRstdTerm"], result.render()
    assert "does not match the numerical derivative in float32" in result.wrong[0].outcomes[0].detail


def test_a_differentiable_backward_with_a_wrong_second_derivative_still_fails_gradgradcheck():
    class SquareSavesDetachedTwice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward((2 * x).detach())  # a graph-free intermediate: d(backward)/dx is lost
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (twice,) = ctx.saved_tensors
            return grad * twice

    result = autograd_scan(SquareSavesDetachedTwice.apply, torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
                           checks=["gradcheck", "gradgradcheck"])
    assert [(o.check, o.status) for o in result.verdicts[0].outcomes] == [("gradcheck", "passed"),
                                                                         ("gradgradcheck", "failed")]


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_a_model_whose_forward_raises_is_reported_with_its_own_error_and_frame():
    class Broken(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(5, 2)

    with pytest.raises(ModelRaised) as raised:
        autograd_scan(Broken(), torch.randn(3, 4))
    text = str(raised.value)
    assert text.startswith("the model's forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert f"test_model_scan.py:{line_of(Broken.forward, 'x @ torch.ones')} in forward" in text


def test_an_error_inside_a_custom_op_names_the_op_and_its_call_site():
    def model(x):
        return ElementwiseMul.apply(x, x[:, :2])

    with pytest.raises(ModelRaised, match=r"ElementwiseMul needs equal shapes.*\n  inside `ElementwiseMul` called at "
                                          r".*test_model_scan.py:\d+"):
        autograd_scan(model, torch.randn(3, 4))


def test_a_model_that_runs_no_custom_op_is_nothing_to_check():
    with pytest.raises(NothingToCheck, match="no custom autograd Function or custom op ran: nothing to check"):
        autograd_scan(torch.nn.Linear(4, 2), torch.randn(3, 4))


@pytest.mark.parametrize(("inputs", "message"), [
    ((), r"the call's inputs \(Sample\(\)\) hold no tensor; the model must be called on tensors"),
    (([1.0, 2.0],), r"the call's inputs \(Sample\(\[1.0, 2.0\]\)\) hold no tensor"),
])
def test_inputs_that_hold_no_tensor_are_refused(inputs, message):
    with pytest.raises(UsageProblem, match=message):
        autograd_scan(WithTable(), *inputs)


def test_usage_errors_of_the_marker_name_the_fix(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import numpy
        import pytest, torch
        from reference_ops.functions import MyReLU

        def relu(x):
            return MyReLU.apply(x)

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_returns_nothing():
            pass

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_returns_the_model_alone():
            return relu

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_returns_numpy():
            return relu, (numpy.ones(3),)

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_plain_torch():
            return torch.nn.Linear(3, 2), (torch.randn(2, 3),)

        @pytest.mark.autograd_model(checks=["gradcheck"], ops=["Nope"])
        def test_unknown_op():
            return relu, (torch.randn(2, 3),)

        @pytest.mark.autograd_models(checks=["gradcheck"])
        def test_typo():
            return relu, (torch.randn(2, 3),)
    """, "-rs")
    result.assert_outcomes(failed=4, skipped=1, errors=1)
    result.stdout.fnmatch_lines_random([
        "*the test body returned None; a test marked autograd_model must `return model, (x,)`*",
        "*the test body returned the model alone (function); return its inputs too*",
        "*the call's inputs hold a numpy array; pass torch tensors (torch.from_numpy(array))*",
        "SKIPPED*no custom autograd Function or custom op ran: nothing to check*",
        "*ops= names 'Nope', which did not run in the model's forward; the custom ops that ran are: `MyReLU`*",
        "*@pytest.mark.autograd_models is not a registered marker and looks like a typo of "
        "@pytest.mark.autograd_model*",
    ])


def test_marker_mistakes_fail_their_test_naming_the_fix(pytester, run_pytest):
    pytester.makepyfile(test_both="""
        import pytest, torch
        from reference_ops.functions import MyReLU

        @pytest.mark.autograd_op(op=MyReLU)
        @pytest.mark.autograd_model()
        def test_both():
            return [(torch.randn(3),)]
    """, test_option="""
        import pytest

        @pytest.mark.autograd_model(checks=["gradcheck"], atoll=1e-3)
        def test_unknown_option():
            pass
    """, test_reference="""
        import pytest, torch

        @pytest.mark.autograd_model(reference=torch.mul)
        def test_model_wide_reference():
            pass
    """)
    result = run_pytest()
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines_random([
        "*carries @pytest.mark.autograd_op (one op, the body returns its samples) or @pytest.mark.autograd_model "
        "(a model, *), not both*",
        "*test_unknown_option: unknown option(s) atoll (did you mean atol?)*",
        "*test_model_wide_reference: reference= applies to one op, not to a whole model; give it for that op: "
        "op_options=*",
    ])


# ---------------------------------------------------------------------------
# The fixture, the items, the engine without pytest
# ---------------------------------------------------------------------------


def test_the_fixture_fails_listing_every_wrong_op_and_returns_the_verdicts_of_a_correct_model(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import torch
        from reference_ops.functions import LinearFunction, MyReLU
        from reference_ops.buggy import LinearWeightGradTransposed, ReLUPositiveGradOnly

        def wrong(x, w):
            return ReLUPositiveGradOnly.apply(LinearWeightGradTransposed.apply(x, w))

        def right(x, w):
            return MyReLU.apply(LinearFunction.apply(x, w))

        def test_wrong(autograd_scan):
            autograd_scan(wrong, torch.randn(3, 4), torch.randn(5, 4, requires_grad=True), checks=["gradcheck"])

        def test_right(autograd_scan):
            result = autograd_scan(right, torch.randn(3, 4), torch.randn(5, 4, requires_grad=True))
            assert [v.name for v in result.passed] == ["LinearFunction", "MyReLU"]
    """)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*autograd_scan: 2 ops checked, 2 wrong: `LinearWeightGradTransposed` at test_*.py:6 (gradcheck); "
        "`ReLUPositiveGradOnly` at test_*.py:6 (gradcheck)",
    ])


def test_each_check_is_an_item_and_xfail_and_skip_apply_per_check(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearWeightGradTransposed

        def model(x, w):
            return LinearWeightGradTransposed.apply(x, w)

        @pytest.mark.autograd_model(checks=["gradcheck", "mutation", "opcheck"], xfail={"gradcheck": "known"})
        def test_model():
            return model, (torch.randn(3, 4), torch.randn(5, 4, requires_grad=True))
    """, "-v", "-rs")
    result.assert_outcomes(passed=1, xfailed=1, skipped=1)
    result.stdout.fnmatch_lines_random([
        "*test_model[[]gradcheck-cpu[]] XFAIL*",
        "*test_model[[]mutation-cpu[]] PASSED*",
        "*opcheck judged none of the model's 1 custom ops: `LinearWeightGradTransposed`: op is not a torch.library "
        "operator*",
    ])


def test_the_json_record_of_a_failing_model_item_names_the_wrong_op(pytester, run_pytest):
    import json

    run(pytester, run_pytest, """
        import pytest, torch
        from reference_ops.buggy import LinearWeightGradTransposed

        def model(x, w):
            return LinearWeightGradTransposed.apply(x, w)

        @pytest.mark.autograd_model(checks=["gradcheck"])
        def test_model():
            return model, (torch.randn(3, 4), torch.randn(5, 4, requires_grad=True))
    """, "--autograd-json=record.json")
    (record,) = json.loads((pytester.path / "record.json").read_text())["records"]
    assert record["outcome"] == "failed" and record["check"] == "gradcheck"
    assert record["failure"]["summary"] == ("`LinearWeightGradTransposed` at test_the_json_record_of_a_failing_model_"
                                            "item_names_the_wrong_op.py:5: gradient of output w.r.t. `weight` does "
                                            "not match the numerical derivative")
    assert record["failure"]["argument"] == "weight"


def test_the_engine_scan_runs_without_pytest(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = textwrap.dedent("""
        import sys
        sys.modules["pytest"] = sys.modules["_pytest"] = sys.modules["pluggy"] = None
        import torch
        from pytest_autograd import autograd_scan
        from reference_ops.functions import LinearFunction
        from reference_ops.buggy import LinearWeightGradTransposed

        def model(x, w1, w2):
            return LinearWeightGradTransposed.apply(LinearFunction.apply(x, w1), w2)

        w1, w2 = torch.randn(5, 4, requires_grad=True), torch.randn(3, 5, requires_grad=True)
        result = autograd_scan(model, torch.randn(2, 4), w1, w2, checks=["gradcheck"])
        print(result.summary())
    """)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("2 ops checked, 1 wrong: `LinearWeightGradTransposed` at <string>:10 "
                                   "(gradcheck)")


def test_a_model_items_notes_are_in_the_warnings_summary_where_the_footer_says_they_are(pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest, torch

        class Rotary(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, cos, sin):
                x1, x2 = x.chunk(2, -1)
                ctx.save_for_backward(cos, sin)
                return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

            @staticmethod
            def backward(ctx, grad):
                cos, sin = ctx.saved_tensors
                g1, g2 = grad.chunk(2, -1)
                return torch.cat([g1 * cos + g2 * sin, -g1 * sin + g2 * cos], -1), None, None

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                angles = torch.arange(6.0)[:, None] * torch.rand(4)[None]
                self.register_buffer("cos", angles.cos())
                self.register_buffer("sin", angles.sin())

            def forward(self, x):
                return Rotary.apply(x, self.cos, self.sin)

        @pytest.mark.autograd_model(checks=["sizes"], op_options={"Rotary": {"sizes": {8: [9]}}})
        def test_model():
            return Model(), (torch.randn(2, 6, 8),)
    """, "-rw")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*AutogradNote: `Rotary`: sample 0: sizes: * the op refuses *",
                                 "*1 note(s) on 1 item(s), not failures: in the warnings summary*"])


# ---------------------------------------------------------------------------
# Sizes: judged where the model calls each op, at other input sizes
# ---------------------------------------------------------------------------


def test_the_model_is_run_again_at_other_input_sizes_and_a_dim_its_architecture_fixes_never_changes():
    from pytest_autograd.engine.model_sizes import model_sizes
    from reference_ops.model_sizes import RotaryAttention, rotary_inputs

    model, calls = RotaryAttention(), [Sample(*rotary_inputs())]
    capture = capture_model(model, calls)
    sizes = model_sizes(model, calls, capture)
    assert {(run.old, run.new) for run in sizes.runs} >= {(2, 1), (8, 7), (8, 9), (8, 17)}  # a batch of one, tails
    assert {old for old, _, _ in sizes.refused} >= {12}  # the hidden size: the projections refuse it
    rotary = next(op for op in group_calls(capture.calls) if op.name == "RotaryEmbedding")
    judged = sizes.samples_for(rotary, rotary.signatures[0])
    shapes = {tuple(sample.args[0].shape) for sample, _ in judged}
    assert {(1, 2, 8, 6), (2, 2, 9, 6), (2, 2, 1, 6)} <= shapes
    assert {shape[-1] for shape in shapes} == {6}  # the head dim the config fixes
    assert all(tuple(sample.args[1].shape) == (sample.args[0].shape[2], 6) for sample, _ in judged)  # its tables
    assert "when its inputs are `x` [2, 9, 12] (size 8 of its inputs made 9)" in dict(
        (tuple(sample.args[0].shape), origin) for sample, origin in judged)[(2, 2, 9, 6)]


def test_a_rotary_embedding_written_for_even_head_dims_passes_the_scan_which_never_tries_an_odd_head_dim(
        pytester, run_pytest):
    result = run(pytester, run_pytest, """
        import pytest
        from reference_ops.model_sizes import RotaryAttention, rotary_inputs

        @pytest.mark.autograd_model(checks=["sizes"])
        def test_rotary():
            return RotaryAttention(), rotary_inputs()
    """, "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines_random([
        "sizes-cpu: 2 ops checked, none wrong",
        "`RotaryEmbedding` at *reference_ops/model_sizes.py:* (and 1 other site): 2 calls, 1 signature, 1 checked: "
        "passed",
    ])


def test_the_rotary_model_passes_every_default_check_of_the_scan():
    from reference_ops.model_sizes import RotaryAttention, rotary_inputs

    result = autograd_scan(RotaryAttention(), *rotary_inputs())
    assert [v.name for v in result.passed] == ["RotaryEmbedding", "ChunkedCumsum"], result.render()
    assert all(o.status != "failed" for v in result.verdicts for o in v.outcomes), result.render()


PLANTED_TAIL = """
    import pytest
    from reference_ops.model_sizes import ChunkedCumsumDropsTail, RotaryAttention, rotary_inputs

    @pytest.mark.autograd_model(checks=["gradcheck", "sizes"])
    def test_tail():
        return RotaryAttention(cumsum=ChunkedCumsumDropsTail), rotary_inputs()
"""

PLANTED_TAIL_REPORT = [
    "*sizes-cpu: 2 ops checked, 1 wrong: `ChunkedCumsumDropsTail` at *reference_ops/model_sizes.py:* (sizes)",
    "`ChunkedCumsumDropsTail` at *: 1 call, 1 signature, 1 checked: failed",
    "    sizes-cpu failed: gradient w.r.t. `x` is wrong when dim 1 of `x` (size 8 in your sample) is 9",
    "*the model calls the op with these arguments when its inputs are `x` [[]2, 9, 12[]] (size 8 of its inputs made 9)",
    "*sizes of dim 1 of `x` judged: right at 8; wrong at 1, 7, 9, 17",
]


def test_a_running_sum_that_drops_the_tail_fails_at_a_sequence_length_the_model_produces(pytester, run_pytest):
    result = run(pytester, run_pytest, PLANTED_TAIL, "-v")
    result.assert_outcomes(passed=1, failed=1)  # gradcheck passes at the captured length, 8: two whole chunks
    result.stdout.fnmatch_lines(["*test_tail[[]gradcheck-cpu[]] PASSED*"])
    result.stdout.fnmatch_lines(PLANTED_TAIL_REPORT)


def test_the_planted_tail_fails_the_same_way_under_xdist(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(textwrap.dedent(PLANTED_TAIL))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(PLANTED_TAIL_REPORT)


def test_size_samples_judge_the_op_at_those_arguments_only_and_a_wrong_one_fails():
    from pytest_autograd.engine.api import run_checks
    from reference_ops.model_sizes import ChunkedCumsum, ChunkedCumsumDropsTail

    x = torch.randn(2, 8, 3)
    at_batch_one = [(Sample(torch.randn(1, 8, 3)), "where the caller calls it")]
    (right,) = run_checks(ChunkedCumsumDropsTail, samples=Sample(x), checks=["sizes"], size_samples=at_batch_one)
    assert right.status == "passed", right.detail  # no length but 8 is tried
    (wrong,) = run_checks(ChunkedCumsumDropsTail, samples=Sample(x), checks=["sizes"],
                          size_samples=at_batch_one + [Sample(torch.randn(2, 5, 3))])
    assert wrong.status == "failed"
    assert wrong.detail.startswith("gradient w.r.t. `x` is wrong when dim 1 of `x` (size 8 in your sample) is 5")
    (none,) = run_checks(ChunkedCumsum, samples=Sample(x), checks=["sizes"], size_samples=[])
    assert none.status == "skipped" and "size_samples= gives no other sizes" in none.detail
    with pytest.raises(UsageProblem, match=r"size_samples= entry 0 .* has the structure of none of your samples"):
        run_checks(ChunkedCumsum, samples=Sample(x), checks=["sizes"], size_samples=[Sample(torch.randn(8, 3))])


def test_sizes_declared_for_an_op_replace_the_model_sizes_and_size_samples_for_a_whole_model_are_refused():
    from reference_ops.model_sizes import RotaryAttention, rotary_inputs

    declared = autograd_scan(RotaryAttention(), *rotary_inputs(), checks=["sizes"],
                             op_options={"RotaryEmbedding": {"sizes": {6: [7]}}})  # an odd head dim, declared
    assert [v.name for v in declared.wrong] == ["RotaryEmbedding"], declared.render()
    with pytest.raises(UsageProblem, match=r"size_samples= applies to one op, not to a whole model"):
        autograd_scan(RotaryAttention(), *rotary_inputs(), checks=["sizes"], size_samples=[])
