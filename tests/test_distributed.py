"""Ops that talk across ranks, checked on a real process group of two ranks (gloo, on CPU): every planted
communication bug of reference_ops.distributed fails with a message naming it, every correct layer passes, and a
rank that hangs or crashes ends its item, not the session.

The layers are checked in one pytest session (the ranks take seconds to form), whose report the tests read.
"""

import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch.distributed")
pytest.importorskip("torch.distributed.tensor", reason="DTensor's placements are public from torch 2.5")

LAYERS = '''
import pytest, torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard
from reference_ops import distributed as d

WORLD = 2


def rows_to_ranks(tokens):
    """all_to_all_single over WORLD ranks, read on the global tensor: block (r, s) of rows goes to (s, r)."""
    blocks = tokens.reshape(WORLD, WORLD, -1, *tokens.shape[1:])
    return blocks.transpose(0, 1).reshape(tokens.shape)


def per_row_loss(logits, target):
    return F.cross_entropy(logits, target, reduction="none")


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


LAYOUTS = {
    "copy_to_region": (d.CopyToRegion, d.CopyToRegionNoAllReduce, torch.clone,
                       dict(output_placements=Replicate(), output_grad_placements=Partial()),
                       lambda: (torch.randn(6, 8),)),
    "reduce_from_region": (d.ReduceFromRegion, d.ReduceFromRegionReducesGrad, torch.clone,
                           dict(placements={"x": Partial()}, output_placements=Replicate()),
                           lambda: (torch.randn(6, 8),)),
    "gather_from_region": (d.GatherFromRegion, d.GatherFromRegionWrongOrder, torch.clone,
                           dict(placements={"x": Shard(-1)}, output_placements=Replicate()),
                           lambda: (torch.randn(6, 8),)),
    "column_parallel": (d.ColumnParallelLinear, d.ColumnParallelLinearNoInputAllReduce, F.linear,
                        dict(placements={"weight": Shard(0), "bias": Shard(0)}, output_placements=Shard(-1)),
                        lambda: (torch.randn(8, 16), torch.randn(12, 16), torch.randn(12))),
    "row_parallel": (d.RowParallelLinear, d.RowParallelLinearBiasOnEveryRank, F.linear,
                     dict(placements={"x": Shard(-1), "weight": Shard(1)}, output_placements=Replicate()),
                     lambda: (torch.randn(8, 16), torch.randn(12, 16), torch.randn(12))),
    "vocab_parallel": (d.VocabParallelCrossEntropy, d.VocabParallelCrossEntropyLocalMax, per_row_loss,
                       dict(placements={"logits": Shard(-1)}, output_placements=Replicate()),
                       lambda: (torch.randn(6, 10), torch.randint(0, 10, (6,)))),
    "sequence_parallel_norm": (d.SequenceParallelLayerNorm, d.SequenceParallelLayerNormNoWeightAllReduce,
                               layer_norm, dict(placements={"x": Shard(0)}, output_placements=Shard(0)),
                               lambda: (torch.randn(8, 6), torch.randn(6), torch.randn(6))),
    "all_to_all": (d.AllToAllDispatch, d.AllToAllDispatchNoBackwardExchange, rows_to_ranks,
                   dict(placements={"tokens": Shard(0)}, output_placements=Shard(0)),
                   lambda: (torch.randn(8, 4),)),
    "functional_reduce": (d.ReduceFromRegionFunctional, d.ReduceFromRegionFunctionalReducesGrad, torch.clone,
                          dict(placements={"x": Partial()}, output_placements=Replicate()),
                          lambda: (torch.randn(6, 8),)),
    "dtensor_local_shards": (d.column_linear_on_local_shards, d.column_linear_on_local_shards_without_partial_grad,
                             F.linear, dict(dtensors=True, placements={"weight": Shard(0), "bias": Shard(0)},
                                            output_placements=Shard(-1)),
                             lambda: (torch.randn(8, 16), torch.randn(12, 16), torch.randn(12))),
    "dtensor_linear": (d.dtensor_linear, None, F.linear,
                       dict(dtensors=True, placements={"weight": Shard(0), "bias": Shard(0)},
                            output_placements=Shard(-1)),
                       lambda: (torch.randn(8, 16), torch.randn(12, 16), torch.randn(12))),
}


def make(name, planted):
    correct, twin, reference, layout, samples = LAYOUTS[name]

    @pytest.mark.autograd_op(op=twin if planted else correct, reference=reference, world_size=WORLD, **layout)
    def test():
        return samples()

    return test


for _name in LAYOUTS:
    globals()[f"test_{_name}"] = make(_name, planted=False)
    if LAYOUTS[_name][1] is not None:
        globals()[f"test_{_name}_planted"] = make(_name, planted=True)
'''


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    """The report of one session checking every layer and its planted twin on two ranks."""
    root = tmp_path_factory.mktemp("layers")
    (root / "test_layers.py").write_text(textwrap.dedent(LAYERS))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_layers.py"],
                          cwd=root, capture_output=True, text=True, timeout=1800)
    return done.stdout


def failures_of(report, test):
    """The failure sections of ``test``'s items in a session's report, as one text."""
    sections = report.split("\n_")
    return "\n".join(section for section in sections if f"{test}[" in section.splitlines()[0])


def failed_items(report):
    return [line.split(" ")[1] for line in report.splitlines() if line.startswith("FAILED ")]


def test_every_correct_layer_passes_every_check_judged_across_ranks(layers):
    correct = [item for item in failed_items(layers) if "_planted[" not in item]
    assert correct == [], layers
    assert "passed" in layers.splitlines()[-1]


@pytest.mark.parametrize("layer", ["copy_to_region", "reduce_from_region", "gather_from_region", "column_parallel",
                                   "row_parallel", "vocab_parallel", "sequence_parallel_norm", "all_to_all",
                                   "functional_reduce", "dtensor_local_shards"])
def test_every_planted_communication_bug_fails(layers, layer):
    assert any(f"test_{layer}_planted[" in item for item in failed_items(layers)), layers


def test_a_copy_to_region_without_its_all_reduce_fails_naming_the_rank_whose_gradient_differs(layers):
    assert ("the gradient of `x` is Replicate() (the placement of `x`), but rank(s) 1 hold another one than rank 0: "
            "a replicated argument's gradient must be summed over the ranks (an all-reduce missing in backward?)"
            in failures_of(layers, "test_copy_to_region_planted"))


def test_a_reduction_that_reduces_its_gradient_again_fails_with_the_world_size_hint(layers):
    found = failures_of(layers, "test_reduce_from_region_planted")
    assert ("the gradient of `x` is 2x the reference on every rank (2 ranks): the backward all-reduces a gradient "
            "that was already reduced" in found)
    # a correct mapping whose incoming gradient the layout misdeclared fails the same way: the hint says how to say so
    assert "say so: output_grad_placements=Partial() (here: Replicate())" in found


def test_a_bias_added_on_every_rank_before_the_reduction_fails_with_the_once_per_rank_hint(layers):
    found = failures_of(layers, "test_row_parallel_planted")
    assert re.search(r"`bias`\[\d+\] in global coordinates: every rank holds it \(Replicate\(\)\)", found), found
    assert ("the analytical gradient of `bias` is 1/2 of the numerical one (2 ranks): the forward counts `bias` once "
            "per rank (a bias added on every rank before the reduction?)" in found)


def test_a_wrong_gradient_of_a_sharded_argument_names_the_rank_that_holds_the_element(layers):
    found = failures_of(layers, "test_vocab_parallel_planted")
    assert "gradient w.r.t. `logits` from the op differs from the reference" in found
    assert "in global coordinates: rank " in found and "(Shard(-1): " in found


def test_a_dtensor_op_whose_replicated_input_loses_its_partial_gradient_fails_naming_to_local(layers):
    found = failures_of(layers, "test_dtensor_local_shards_planted")
    assert "but rank(s) 1 hold another one than rank 0" in found, found
    assert "needs to_local(grad_placements=[Partial()])" in found


def test_ranks_gathered_in_the_wrong_order_fail_the_reference(layers):
    assert "output of the op differs from the reference" in failures_of(layers, "test_gather_from_region_planted")


def test_checks_that_judge_one_process_are_skipped_saying_why(layers):
    assert "leak judges what one process holds (its memory, its graph, a compiled or vmapped call): not run for an op " \
           "across 2 ranks" in layers
    assert "the second derivative of an op across 2 ranks is not judged" in layers


STALLS = '''
import ctypes
import pytest, torch
import torch.distributed as dist


class SkipsTheCollectiveOnRankZero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        if dist.get_rank() != 0:
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class CrashesOnRankOne(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if dist.get_rank() == 1:
            ctypes.string_at(0)
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


@pytest.mark.autograd_op(op=SkipsTheCollectiveOnRankZero, world_size=2, checks=["gradcheck"])
def test_hangs():
    return (torch.randn(4),)


@pytest.mark.autograd_op(op=CrashesOnRankOne, world_size=2, checks=["gradcheck"])
def test_crashes():
    return (torch.randn(4),)


@pytest.mark.autograd_op(op=torch.clone, reference=torch.clone, world_size=2, checks=["gradcheck", "reference"])
def test_after():
    return (torch.randn(4),)
'''


def test_a_rank_that_waits_in_a_collective_the_others_skipped_ends_its_item_naming_where_it_waited(pytester):
    pytester.makepyfile(test_stalls=STALLS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(failed=2, passed=2)
    result.stdout.fnmatch_lines([
        "the op's forward raised RanksFailed: in its forward: rank 0 finished; rank 1 waited * s at File "
        "*test_stalls.py*, line * in forward (in a collective the other ranks never reached?)*",
    ])
    result.stdout.fnmatch_lines(["*rank 1 crashed (SIGSEGV) at File *test_stalls.py*, line * in forward*"])
    assert (pytester.path / "junit.xml").read_text().count("<testcase") == 4


SETUP = '''
import pytest, torch
import parallel_state


class ScaledByTheRanksSetup(torch.autograd.Function):
    """Multiplies by the factor the project's rank setup stored on every rank."""

    @staticmethod
    def forward(ctx, x):
        return x * parallel_state.FACTOR

    @staticmethod
    def backward(ctx, grad):
        return grad * parallel_state.FACTOR


@pytest.mark.autograd_op(op=ScaledByTheRanksSetup, reference=lambda x: 3 * x, world_size=2,
                         checks=["gradcheck", "reference"])
def test_scaled():
    return (torch.randn(4),)
'''


def test_the_projects_rank_setup_runs_on_every_rank_before_the_op(pytester):
    pytester.makepyfile(parallel_state="FACTOR = 1\n", test_setup=SETUP)
    pytester.makeconftest("""
        def pytest_autograd_setup_rank(rank, world_size):
            import parallel_state
            parallel_state.FACTOR = 3
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_placements_that_name_no_argument_fail_the_test_naming_the_arguments(pytester, run_pytest):
    pytester.makepyfile(test_usage="""
        import pytest, torch
        from torch.distributed.tensor import Shard
        from reference_ops.distributed import ColumnParallelLinear

        @pytest.mark.autograd_op(op=ColumnParallelLinear, world_size=2, placements={"weights": Shard(0)},
                                 checks=["gradcheck"])
        def test_typo():
            return (torch.randn(4, 3), torch.randn(2, 3), torch.randn(2))

        @pytest.mark.autograd_op(op=ColumnParallelLinear, world_size=2, placements={"weight": Shard(2)},
                                 checks=["gradcheck"])
        def test_dim():
            return (torch.randn(4, 3), torch.randn(2, 3), torch.randn(2))
    """)
    result = run_pytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*placements names 'weights', which is not an argument of the op; its arguments are: x, weight, bias*"])
    result.stdout.fnmatch_lines(["*placements: Shard(2) of `weight`, which has 2 dim(s) in sample 0*"])


def test_a_layout_that_does_not_fit_the_op_is_the_layouts_mistake_named_with_its_fix(pytester, run_pytest):
    pytester.makepyfile(test_usage="""
        import pytest, torch
        from torch.distributed.tensor import Replicate, Shard
        from reference_ops.distributed import ColumnParallelLinear, RowParallelLinear

        def samples():
            return (torch.randn(4, 6), torch.randn(2, 6), torch.randn(2))

        @pytest.mark.autograd_op(op=RowParallelLinear, world_size=2, placements={7: Shard(1)}, checks=["gradcheck"])
        def test_position():
            return samples()

        @pytest.mark.autograd_op(op=RowParallelLinear, placements={"x": Shard(-1)}, checks=["gradcheck"])
        def test_no_world():
            return samples()

        @pytest.mark.autograd_op(op=ColumnParallelLinear, world_size=2, output_placements=Shard(3),
                                 placements={"weight": Shard(0), "bias": Shard(0)}, checks=["reference"],
                                 reference=torch.nn.functional.linear)
        def test_output_dim():
            return samples()

        @pytest.mark.autograd_model(world_size=2)
        def test_model():
            return torch.nn.Linear(2, 2), (torch.randn(2, 2),)
    """)
    result = run_pytest()
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*placements names position 7, but the op takes 3 positional argument(s) in the "
                                 "samples (x, weight, bias): count from 0, or name the argument*"])
    result.stdout.fnmatch_lines(["*placements= describe ranks, but there is no world_size=: add world_size=N*"])
    result.stdout.fnmatch_lines(["*LayoutMismatch: output_placements: Shard(3) for output 0, which has 2 dim(s) "
                                 "(shape (4, 1) on rank 0): name a dim it has*"])
    result.stdout.fnmatch_lines(["*world_size= check one op across ranks; a model scan runs the model in one process*"])


def test_a_sample_that_splits_unevenly_says_so_beside_the_failure(pytester, run_pytest):
    pytester.makepyfile(test_uneven="""
        import pytest, torch
        from torch.distributed.tensor import Replicate, Shard
        from reference_ops import distributed as d

        @pytest.mark.autograd_op(op=d.GatherFromRegion, reference=torch.clone, world_size=2,
                                 placements={"x": Shard(-1)}, output_placements=Replicate(), checks=["reference"])
        def test_gather():
            return (torch.randn(4, 7),)
    """)
    result = run_pytest()
    result.stdout.fnmatch_lines(["*`x` is split unevenly: dim 1 has 7 over 2 ranks (4, 3, as torch.chunk splits it); "
                                 "a layer written for even shards needs a global size its world divides*"])
