"""Under pytest the items of one test and device share one case: each runs the body, gets the same samples, and the
checks share their work on them; each check still judges alone what it judges beside the others."""

import re

import pytest

COUNTING_TEST = """
import os
import pytest
import torch
from reference_ops.scale import Gelu, gelu_reference


def log(what):
    with open(os.environ["CALLS_LOG"], "a") as calls:
        calls.write(what + "\\n")


class CountedGelu(Gelu):
    @staticmethod
    def forward(ctx, x):
        log("forward")
        return Gelu.forward(ctx, x)


@pytest.mark.autograd_op(op=CountedGelu, reference=gelu_reference)
def test_gelu():
    log("body")
    return [(torch.randn(64, 128),)]
"""

DOUBLE_BACKWARD_BUG = """
import pytest
import torch
from reference_ops.scale import FAMILIES, LayerNormAffineSavesRstd


@pytest.mark.autograd_op(op=LayerNormAffineSavesRstd, reference=FAMILIES["layer_norm"].reference)
def test_layer_norm():
    return [FAMILIES["layer_norm"].samples(1 << 13, torch.Generator().manual_seed(0))[0]]
"""

REVERSED_ORDER = """
def pytest_collection_modifyitems(items):
    items.reverse()
"""


def calls(pytester, run_pytest, monkeypatch, *args, passed=2):
    log = pytester.path / "calls.log"
    if log.exists():
        log.unlink()
    monkeypatch.setenv("CALLS_LOG", str(log))
    run_pytest(*args).assert_outcomes(passed=passed)
    return log.read_text().split()


def test_what_the_body_sets_up_holds_for_every_items_check(pytester, run_pytest):
    pytester.makepyfile(
        mylib="""
        import torch

        USE_FAST_KERNEL = True


        class Scale2(torch.autograd.Function):  # BUG: the fallback kernel scales by 2.5
            @staticmethod
            def forward(ctx, x):
                ctx.factor = 2.0 if USE_FAST_KERNEL else 2.5
                return x * ctx.factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor
        """,
        test_fallback="""
        import pytest
        import torch
        import mylib


        @pytest.mark.autograd_op(op=mylib.Scale2, reference=lambda x: 2 * x, checks=["gradcheck", "reference"])
        def test_fallback_path(monkeypatch):
            monkeypatch.setattr(mylib, "USE_FAST_KERNEL", False)
            return [(torch.randn(8, 4),)]
        """,
    )
    result = run_pytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    assert "test_fallback_path[reference-cpu]" in "\n".join(line for line in result.outlines if "FAILED" in line)


def test_an_item_whose_check_does_not_apply_skips_without_calling_the_body_again(pytester, run_pytest, monkeypatch):
    # CountedGelu defines no jvp: forward_ad does not apply, which the case gradcheck's item built already shows
    pytester.makepyfile(test_counted=COUNTING_TEST)
    log = pytester.path / "calls.log"
    monkeypatch.setenv("CALLS_LOG", str(log))
    result = run_pytest("--autograd-checks=gradcheck,forward_ad,reference", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*op defines no jvp*"])
    assert [line for line in log.read_text().split() if line == "body"] == ["body", "body"]
    alone = run_pytest("--autograd-checks=forward_ad", "-rs")  # no kept case: the item asks its own
    alone.assert_outcomes(skipped=1)
    alone.stdout.fnmatch_lines(["*op defines no jvp*"])


def test_the_items_of_a_test_parametrized_by_its_author_run_next_to_each_other(pytester, run_pytest, monkeypatch):
    pytester.makepyfile(test_counted=COUNTING_TEST.replace(
        "@pytest.mark.autograd_op", '@pytest.mark.parametrize("rows", [8, 16])\n@pytest.mark.autograd_op').replace(
        "def test_gelu():", "def test_gelu(rows):").replace('log("body")', 'log(f"body-{rows}")').replace(
        "torch.randn(64, 128)", "torch.randn(rows, 128)"))
    logged = calls(pytester, run_pytest, monkeypatch, "--autograd-checks=gradcheck,reference", passed=4)
    assert [line for line in logged if line.startswith("body")] == ["body-8", "body-8", "body-16", "body-16"]


def test_the_gradgradcheck_item_runs_no_forward_of_its_own_after_the_gradcheck_item(pytester, run_pytest,
                                                                                    monkeypatch):
    pytester.makepyfile(test_counted=COUNTING_TEST)
    gradcheck_alone = calls(pytester, run_pytest, monkeypatch, "--autograd-checks=gradcheck,reference",
                            "-k", "not reference", passed=1)
    assert gradcheck_alone.count("forward") > 0
    pair = calls(pytester, run_pytest, monkeypatch, "--autograd-checks=gradcheck,gradgradcheck")
    assert pair.count("forward") == gradcheck_alone.count("forward")


def gradgradcheck_report(result):
    text = result.stdout.str()
    start = text.index("test_layer_norm[gradgradcheck-cpu] _")
    return text[start:text.index("rerun:", start)]


@pytest.mark.parametrize("order", ["collected", "reversed"])
def test_a_wrong_double_backward_fails_the_same_way_beside_gradcheck_and_alone(pytester, run_pytest, order):
    pytester.makepyfile(test_bug=DOUBLE_BACKWARD_BUG)
    if order == "reversed":
        pytester.makeconftest(REVERSED_ORDER)
    beside = run_pytest("--autograd-checks=gradcheck,gradgradcheck")
    beside.assert_outcomes(passed=1, failed=1)
    alone = run_pytest("--autograd-checks=gradcheck,gradgradcheck", "-k", "gradgradcheck")
    alone.assert_outcomes(failed=1)
    assert "backward is not differentiable w.r.t. `x`" in gradgradcheck_report(beside)
    assert gradgradcheck_report(alone) == gradgradcheck_report(beside)


@pytest.mark.parametrize("checks", ['checks=["gradcheck", "gradgradcheck", "reference", "precision"], ', ""],
                         ids=["listed checks", "default checks with opt-in ones skipping"])
def test_a_tests_case_is_let_go_after_its_last_item(pytester, checks):
    pytester.makepyfile(
        test_kept=f"""
        import gc
        import weakref
        import pytest
        import torch
        from reference_ops import LinearFunction

        made = []

        @pytest.mark.autograd_op(op=LinearFunction, {checks}reference=torch.nn.functional.linear)
        def test_linear():
            x = torch.randn(4, 3)
            made.append(weakref.ref(x))
            return [(x, torch.randn(5, 3), torch.randn(5))]

        def test_after_it():
            gc.collect()
            assert made and all(ref() is None for ref in made)
        """
    )
    # In a subprocess: an in-process run's hook recorder keeps every case a hook was called with.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    assert result.ret == 0, result.stdout.str()


def test_under_xdist_load_every_item_still_judges_on_its_own(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_bug=DOUBLE_BACKWARD_BUG)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "load",
                                           "--autograd-checks=gradcheck,gradgradcheck")
    result.assert_outcomes(passed=1, failed=1)
    assert re.search(r"FAILED .*test_layer_norm\[gradgradcheck-cpu\]", result.stdout.str())
