"""--autograd-plots draws where a gradient is wrong; the marked element is the wrong one."""

import pytest
import torch

import pytest_autograd.pytest_adapter.reporting

CUBE = """
import pytest, torch
from reference_ops.buggy import CubeWrongAtOneElement

@pytest.mark.autograd_op(op=CubeWrongAtOneElement, checks=["gradcheck"])
def test_cube():
    return [(torch.randn(3, 4),)]
"""


def saved_panels(directory, name):
    png = directory / f"{name}.png"
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")
    return torch.load(png.with_suffix(".pt"))["panels"]


def test_a_wrong_jacobian_element_is_drawn_and_marked_where_it_is(pytester, run_pytest):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_ops=CUBE)
    result = run_pytest("--autograd-plots=pictures")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*picture: *pictures/test_ops.py-test_cube-gradcheck-cpu.png"])
    (panel,) = saved_panels(pytester.path / "pictures", "test_ops.py-test_cube-gradcheck-cpu")
    assert panel["kind"] == "jacobian" and panel["label"] == "d output / d x"
    assert panel["expected"].shape == (12, 12)
    wrong = (panel["difference"].abs() > 1e-6).nonzero().tolist()
    assert wrong == [[11, 11]]  # CubeWrongAtOneElement doubles the last element's gradient
    assert panel["worst"] == (11, 11)
    assert torch.allclose(panel["got"][11, 11], 2 * panel["expected"][11, 11])


def test_a_wrong_output_above_two_dimensions_is_drawn_with_its_leading_dims_flattened(pytester, run_pytest):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_ops="""
        import pytest, torch

        def off_at_one_element(x):
            y = x * 2
            y[1, 2, 3] = 0.0
            return y

        @pytest.mark.autograd_op(op=off_at_one_element, reference=lambda x: x * 2, checks=["reference"])
        def test_double():
            return [(torch.randn(2, 3, 5),)]
    """)
    result = run_pytest("--autograd-plots=pictures")
    result.assert_outcomes(failed=1)
    # The zeroed element is wrong in the output and, having no gradient, in the gradient too: a row for each.
    panel, gradient = saved_panels(pytester.path / "pictures", "test_ops.py-test_double-reference-cpu")
    assert panel["label"] == "output" and gradient["label"] == "grad x"
    assert panel["expected"].shape == (6, 5) and panel["reduced"] == "dims 2x3 flattened into rows"
    assert panel["worst"] == gradient["worst"] == (1 * 3 + 2, 3)


def test_the_circle_marks_the_element_the_report_names_and_a_cross_the_largest_difference(pytester, run_pytest):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_ops="""
        import pytest, torch

        SCALE = torch.tensor([0.001, 1000.0], dtype=torch.float64)
        WRONG = torch.tensor([0.003, 1001.5], dtype=torch.float64)

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * SCALE.to(x.dtype)

            @staticmethod
            def backward(ctx, grad):
                return grad * WRONG.to(grad.dtype)  # 3x off on the tiny entry, 0.15% on the large one

        @pytest.mark.autograd_op(op=Scale, checks=["gradcheck"])
        def test_scale():
            return [(torch.tensor([1.0, 2.0]),)]
    """)
    result = run_pytest("--autograd-plots=pictures", "--autograd-shrink=0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["  worst element: d output[[]0] / d x[[]0]: expected 0.001 (numerical), got 0.003 "
                                 "(analytical)"])
    (panel,) = saved_panels(pytester.path / "pictures", "test_ops.py-test_scale-gradcheck-cpu")
    assert panel["worst"] == (0, 0)  # what the report names: the largest error over its tolerance
    assert panel["largest"] == (1, 1)  # the largest |got - expected|, elsewhere
    assert panel["ranking"].startswith("the largest |got - expected| relative to its tolerance")


def test_passing_items_draw_nothing(pytester, run_pytest):
    pytest.importorskip("matplotlib")
    pytester.makepyfile(test_ops=CUBE.replace("CubeWrongAtOneElement", "Cube").replace("reference_ops.buggy",
                                                                                      "reference_ops"))
    run_pytest("--autograd-plots=pictures").assert_outcomes(passed=1)
    assert not (pytester.path / "pictures").exists()


def test_plots_without_matplotlib_are_refused_with_the_install_hint(pytester, run_pytest, monkeypatch):
    monkeypatch.setattr(pytest_autograd.pytest_adapter.reporting, "matplotlib_installed", lambda: False)
    pytester.makepyfile(test_ops=CUBE)
    result = run_pytest("--autograd-plots=pictures")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--autograd-plots needs matplotlib, which is not installed: pip install 'pytest-autograd[plot]'" in result.stderr.str()


DOCS_EXAMPLE = """
import pytest, torch
from reference_ops.buggy import LinearWeightGradTransposed

@pytest.mark.autograd_op(op=LinearWeightGradTransposed, checks=["gradcheck"])
def test_linear():
    return [(torch.randn(3, 5), torch.randn(5, 5), torch.randn(5))]
"""


def test_the_picture_in_the_docs_is_the_one_the_suite_draws(pytester, run_pytest):
    """docs/reports.md shows docs/images/transposed-weight-grad.png: same data as this run draws."""
    pytest.importorskip("matplotlib")
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    assert "images/transposed-weight-grad.png" in (docs / "reports.md").read_text()
    assert (docs / "images" / "transposed-weight-grad.png").read_bytes().startswith(b"\x89PNG")
    pytester.makepyfile(test_ops=DOCS_EXAMPLE)
    run_pytest("--autograd-plots=pictures").assert_outcomes(failed=1)
    (drawn,) = saved_panels(pytester.path / "pictures", "test_ops.py-test_linear-gradcheck-cpu")
    (shown,) = torch.load(docs / "images" / "transposed-weight-grad.pt")["panels"]
    assert drawn["worst"] == shown["worst"]
    for name in ("expected", "got"):
        assert torch.allclose(drawn[name], shown[name], atol=1e-6)
