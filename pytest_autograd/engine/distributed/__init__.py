"""Ops that talk to other ranks (tensor, sequence, expert parallel layers), checked on a real process group.

    from torch.distributed.tensor import Shard, Replicate

    @pytest.mark.autograd_op(op=ColumnParallelLinear, reference=torch.nn.functional.linear, world_size=2,
                             placements={"weight": Shard(0), "bias": Shard(0)}, output_placements=Shard(-1))
    def test_column_parallel():
        return (torch.randn(8, 16), torch.randn(12, 16), torch.randn(12))   # the global tensors

With ``world_size=`` on the marker, the case's op becomes
``global_op.AcrossRanks``: the op run on every rank of a process group
(``engine.processes.ranks``) on its local shards, seen as one op on the
global tensors the test body returns. The checks that judge an op by its
values and gradients judge that global op (gradcheck's finite differences
run through all ranks; the reference is compared with the assembled
outputs and gradients); those that judge what one process holds (its
memory, its graph, a compiled or vmapped call) are not run across ranks.
"""

OPTIONS = {
    "world_size": None,
    "placements": None,  # argument name or position -> Shard(d) / Replicate() / Partial(); unnamed: Replicate()
    "output_placements": None,  # one placement, or one per output; default Replicate()
    "output_grad_placements": None,  # how each output's incoming gradient reaches the ranks; default DTensor's rule
    "grad_placements": None,  # how each input's gradient is assembled; default its own placement
    "dtensors": False,  # the op takes and returns DTensors: each rank's shards reach it as DTensors on a 1-D mesh
}
JUDGED_ACROSS_RANKS = frozenset({"gradcheck", "reference", "precision", "determinism", "noncontiguous", "extreme",
                                 "requires_grad", "grad_metadata"})
CALL_SECONDS = 30.0  # one call on the ranks (a forward or a backward) may take this long, within the item's budget
# gradcheck's full Jacobian costs two calls on every rank per element (milliseconds each, against microseconds in one
# process): past this many elements the global op is judged by probes through all ranks, as a large input is
EXHAUSTIVE_ACROSS_RANKS = 16


def given_options(options):
    """The distributed options ``options`` (a marker's keywords) sets, sorted: the layout's ones, and world_size."""
    return sorted(name for name in OPTIONS if options.get(name) not in (None, False))


def world_size(case):
    """The case's world size (None: one process)."""
    return case.option("world_size")


def exhaustive_limit(case, default):
    """Elements below which gradcheck builds the full Jacobian of the case's op: fewer across ranks."""
    return EXHAUSTIVE_ACROSS_RANKS if world_size(case) else default


def not_judged(check_name, case):
    """Why ``check_name`` is not run on a case across ranks; None when it is, or the case runs in one process."""
    if not world_size(case) or check_name in JUDGED_ACROSS_RANKS:
        return None
    if check_name == "sizes":
        return (f"sizes is not run across {world_size(case)} ranks: other global sizes split unevenly over the "
                "ranks, which a layer written for sizes its world divides need not accept; give the sizes it must "
                "accept as samples of their own")
    if check_name == "gradgradcheck":
        return (f"the second derivative of an op across {world_size(case)} ranks is not judged: its backward runs "
                "on the ranks, outside the graph gradgradcheck differentiates")
    return (f"{check_name} judges what one process holds (its memory, its graph, a compiled or vmapped call): not "
            f"run for an op across {world_size(case)} ranks")


def reason_not_run(check, case, device):
    """Why ``check`` does not run on ``case`` on ``device``, None when it does: across ranks, ``not_judged``'s reason
    comes first (the check's own ``applies`` would judge the wrapper, not the op)."""
    return not_judged(check.name, case) or check.applies(case, device)


def across_ranks(mark_kwargs, arg_names, samples, where):
    """The op of ``mark_kwargs`` run on ``world_size`` ranks as one op on global tensors (an AcrossRanks), its
    placements validated against ``samples``."""
    from pytest_autograd.engine.distributed.global_op import AcrossRanks
    from pytest_autograd.engine.distributed.layouts import layout_from

    layout = layout_from(mark_kwargs, arg_names, samples, where)
    return AcrossRanks(mark_kwargs["op"], layout)


__all__ = ["JUDGED_ACROSS_RANKS", "OPTIONS", "across_ranks", "exhaustive_limit", "given_options", "not_judged", "reason_not_run",
           "world_size"]
