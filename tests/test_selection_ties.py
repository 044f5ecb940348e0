"""Selection ops at ties: judged where the selection does not flip, never failed for the tie; wrong ones still fail."""

import torch

from pytest_autograd.checks._ties import find_ties, tie_free

HEADER = """
import pytest, torch
from reference_ops.selection import *
"""


def marked(op, samples, extra=""):
    return HEADER + f"""
@pytest.mark.autograd_op(op={op}{extra})
def test_op():
    return {samples}
"""


def run(pytester, run_pytest, source, *args):
    pytester.makepyfile(test_ops=source)
    return run_pytest("-rs", *args)


def test_a_correct_top_k_over_integer_votes_passes_every_default_check_with_a_note(pytester, run_pytest):
    result = run(pytester, run_pytest, marked("TopK", "topk_samples(torch.Generator().manual_seed(0))",
                                              ", reference=topk_reference"))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "test_ops.py::test_op[[]gradcheck-cpu[]]",
        "  *test_ops.py:*: AutogradNote: sample 0: tied values in `x` (* groups), e.g. x[[]*[]] = "
        "x[[]*[]] = *: at a tie a selection (top-k, sort, max, median, argmax) flips, so finite differences measure "
        "another selection than backward differentiates (d output 0[[]*[]] / d x[[]*[]]: expected 0 (numerical), got "
        "1 (analytical)); judged instead along every tie group moved together and at a tie-free point*; noted, not "
        "failed",
    ])


def test_a_top_k_scattering_its_gradients_in_reverse_fails_at_a_tie_free_point(pytester, run_pytest):
    result = run(pytester, run_pytest, marked("TopKReversedGradient",
                                              "topk_samples(torch.Generator().manual_seed(0))"),
                 "--autograd-checks=gradcheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of output 0 w.r.t. `x` does not match the numerical derivative",
        "  check gradcheck, device cpu, dtype float64, sample 0",
        "  output: output 0, argument: x",
        "  worst element: d output 0[[]*[]] / d x[[]*[]]: expected * (numerical), got * (analytical)",
        "  abs error * > tolerance * (full Jacobian; at a tie-free point: the sample's tied values in `x` moved apart "
        "by less than half the gap to any other value, so no selection flips and the failure is not the tie's)",
    ], consecutive=True)


def test_on_a_large_input_probes_crossing_ties_do_not_let_a_wrong_top_k_through(pytester, run_pytest):
    # 1200 elements: random probes, which cross ties everywhere; judged again at a tie-free point.
    samples = "[(votes(30, 40, generator=torch.Generator().manual_seed(0)), 5)]"
    source = marked("TopK", samples).replace("def test_op", "def test_correct") + marked(
        "TopKReversedGradient", samples).replace(HEADER, "").replace("def test_op", "def test_reversed")
    result = run(pytester, run_pytest, source, "--autograd-checks=gradcheck")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_reversed*",
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "*at a tie-free point*",
    ])


def test_a_max_giving_every_tie_the_full_gradient_still_fails_where_ties_move_together(pytester, run_pytest):
    # Right at every tie-free point; wrong only at the tie, where the gradients of the tied elements must add up.
    result = run(pytester, run_pytest, """
import pytest, torch

class MaxFullGradientToTies(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.amax(-1, keepdim=True)
        ctx.save_for_backward((x == out).to(x.dtype))
        return out.squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad.unsqueeze(-1) * mask

@pytest.mark.autograd_op(op=MaxFullGradientToTies, checks=["gradcheck"])
def test_op():
    return [(torch.randint(0, 3, (40, 30), generator=torch.Generator().manual_seed(0)).double(),)]
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "gradient of all outputs w.r.t. `x` does not match the numerical derivative",
        "  worst element: every tie group of `x` moved together: expected * (numerical), got * (analytical)",
        "  abs error * (each tie group moved rigidly at its own rate, a direction where no selection flips (left and "
        "right derivatives agree): the gradients of tied elements must add up to its derivative)",
    ])


def test_torch_selection_ops_at_ties_pass_first_and_second_derivative_checks(pytester, run_pytest):
    result = run(pytester, run_pytest, """
import pytest, torch

def votes(*shape):
    return torch.randint(0, 5, shape, generator=torch.Generator().manual_seed(0)).float()

def top_k(x):
    return torch.topk(x, 3, dim=-1).values

def sort(x):
    return torch.sort(x, dim=-1).values

def median(x):
    return torch.median(x, dim=-1).values

def kth_value(x):
    return torch.kthvalue(x, 2, dim=-1).values

def top1_routing(logits, x, w):
    expert = logits.argmax(-1)
    gate = logits.softmax(-1).gather(-1, expert[:, None])
    return gate * torch.einsum("td,tdh->th", x, w[expert])

for op in (top_k, sort, median, kth_value):
    @pytest.mark.autograd_op(op=op, checks=["gradcheck", "gradgradcheck"])
    def test(op=op):
        return [(votes(4, 7),)]
    globals()[f"test_{op.__name__}"] = test
del test

@pytest.mark.autograd_op(op=top1_routing, checks=["gradcheck", "gradgradcheck"])
def test_routing():
    return [(votes(5, 3), torch.randn(5, 4), torch.randn(3, 4, 2))]
""")
    result.assert_outcomes(passed=10)


def test_an_op_breaking_ties_differently_from_its_reference_passes_with_a_note(pytester, run_pytest):
    result = run(pytester, run_pytest, HEADER + """
class TopKLastOfTies(TopK):
    '''Picks the last of tied elements (a kernel scanning from the end), where torch.topk picks another.'''

    @staticmethod
    def forward(ctx, x, k):
        values, flipped = torch.topk(x.flip(-1), k, dim=-1)
        indices = x.shape[-1] - 1 - flipped
        ctx.save_for_backward(indices)
        ctx.shape = x.shape
        ctx.mark_non_differentiable(indices)
        return values, indices

@pytest.mark.autograd_op(op=TopKLastOfTies, reference=topk_reference, checks=["reference", "precision"])
def test_op():
    return topk_samples(torch.Generator().manual_seed(0))
""")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "test_ops.py::test_op[[]reference-cpu[]]",
        "  *test_ops.py:*: AutogradNote: sample 0: reference: the op and the reference differ only at "
        "ties (tied values in `x`*): each picks "
        "its own among tied elements; with the ties moved apart they agree; noted, not failed",
    ])


def test_a_float32_only_top_k_is_judged_at_a_tie_free_point_too(pytester, run_pytest):
    result = run(pytester, run_pytest, HEADER + """
def float32_only(x):
    if x.dtype != torch.float32:
        raise TypeError(f"top-k kernel: float32 only, got {x.dtype}")

class TopK32(TopK):
    @staticmethod
    def forward(ctx, x, k):
        float32_only(x)
        return TopK.forward(ctx, x, k)

class TopK32Reversed(TopKReversedGradient):
    @staticmethod
    def forward(ctx, x, k):
        float32_only(x)
        return TopK.forward(ctx, x, k)

@pytest.mark.autograd_op(op=TopK32, checks=["gradcheck"])
def test_correct():
    return [(votes(3, 6, generator=torch.Generator().manual_seed(0)), 2)]

@pytest.mark.autograd_op(op=TopK32Reversed, checks=["gradcheck"])
def test_reversed():
    return [(votes(3, 6, generator=torch.Generator().manual_seed(0)), 2)]
""")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["gradient of all outputs w.r.t. `x` does not match the numerical derivative in "
                                 "float32", "*at a tie-free point (the sample's tied values moved apart)*"])


def test_ties_are_broken_without_reordering_distinct_values():
    x = torch.tensor([[3.0, 1.0, 3.0, 3.0], [0.0, 1.0, 2.0, 0.0]], dtype=torch.float64)
    ties = find_ties([x], ["x"])
    assert ties.counts == [3] and ties.example == "x[0, 0] = x[0, 2] = 3"
    assert ties.holds(0, 2) and not ties.holds(0, 6)
    (moved,) = tie_free([x], ties, torch.Generator().manual_seed(0), 1e-6)
    assert not find_ties([moved], ["x"])
    assert torch.equal(torch.argsort(torch.unique(x)), torch.argsort(torch.unique(x)))
    original_order = x.reshape(-1).argsort(stable=True)
    distinct = x.reshape(-1)[original_order]
    assert bool((moved.reshape(-1)[original_order].diff()[distinct.diff() > 0] > 0).all())
    assert float((moved - x).abs().max()) < 0.5  # less than half the gap (1) to another value
    assert find_ties([torch.randn(5, 5, dtype=torch.float64)], ["x"]).counts == [0]
