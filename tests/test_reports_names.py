"""Ops are named in reports, tables and JSON the way their authors wrote them."""

import functools

import torch

from pytest_autograd.results.naming import display_name
from reference_ops import LinearFunction


@torch.library.custom_op("pytest_autograd_names::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_torch_library_operator_is_named_by_its_qualified_name_not_pybind11s_record():
    assert display_name(torch.ops.aten.sin) == "aten::sin"
    assert display_name(torch.ops.aten.sin.default) == "aten::sin"


def test_a_non_default_overload_keeps_its_overload_name():
    assert display_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"


def test_a_custom_op_is_named_by_its_namespace_and_name():
    assert display_name(_scale) == "pytest_autograd_names::scale"
    assert display_name(torch.ops.pytest_autograd_names.scale) == "pytest_autograd_names::scale"


def test_torch_functions_are_named_as_users_call_them():
    assert display_name(torch.exp) == "torch.exp"
    assert display_name(torch.nn.functional.linear) == "linear"


def test_a_lambda_is_named_by_where_it_was_written():
    op = lambda x: x * 2  # noqa: E731
    assert display_name(op) == f"lambda at test_reports_names.py:{op.__code__.co_firstlineno}"


def test_a_partial_names_the_function_and_its_bound_arguments():
    assert display_name(functools.partial(torch.nn.functional.linear, bias=None)) == "partial(linear, bias=None)"


def test_functions_and_methods_keep_their_owner():
    class Scaler:
        def forward(self, x):
            return x

    assert display_name(LinearFunction) == "LinearFunction"
    assert display_name(LinearFunction.apply) == "LinearFunction.apply"
    assert display_name(Scaler().forward).endswith("Scaler.forward")
    assert "<locals>" not in display_name(Scaler().forward)


def test_a_module_is_named_by_its_class_and_configuration():
    assert display_name(torch.nn.Linear(3, 2)) == "Linear(in_features=3, out_features=2, bias=True)"


def test_a_very_long_name_is_shortened():
    op = functools.partial(torch.nn.functional.linear, *range(40))
    assert len(display_name(op)) <= 80 and display_name(op).endswith("...")


def test_the_bench_table_names_a_torch_ops_operator_by_its_qualified_name(pytester):
    pytester.makepyfile("""
        import pytest, torch

        @pytest.mark.autograd_op(op=torch.ops.aten.sin, reference=torch.sin)
        def test_sin():
            return (torch.randn(64),)
    """)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--assert=plain", "-p", "no:unraisableexception", "-p", "no:benchmark",
        "-p", "no:xdist", "--autograd-checks=bench", "--autograd-bench", "--autograd-bench-budget=0.01",
        "--autograd-bench-warmup=0.001")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*aten::sin*"])
    result.stdout.no_fnmatch_line("*pybind11*")
