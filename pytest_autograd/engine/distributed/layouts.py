"""The marker's world and placements, validated into a ``global_op.Layout``: every mistake named with its fix."""

from pytest_autograd.engine.distributed.global_op import Layout
from pytest_autograd.engine.distributed.placements import EXAMPLE, REPLICATE, placement_of
from pytest_autograd.engine.outcomes import UsageProblem


def layout_from(options, arg_names, samples, where):
    size = options.get("world_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UsageProblem(f"{where}: world_size={size!r}: give the number of ranks, an int of 1 or more "
                           "(e.g. world_size=2)")
    inputs = _by_slot(options.get("placements"), "placements", arg_names, samples, where)
    grads = _by_slot(options.get("grad_placements"), "grad_placements", arg_names, samples, where)
    outputs = _per_output(options.get("output_placements"), "output_placements", where) or [REPLICATE]
    output_grads = _per_output(options.get("output_grad_placements"), "output_grad_placements", where)
    dtensors = options.get("dtensors", False)
    if not isinstance(dtensors, bool):
        raise UsageProblem(f"{where}: dtensors={dtensors!r}: give True for an op that takes and returns DTensors "
                           "(each rank's shards reach it as DTensors with the declared placements), False otherwise")
    layout = Layout(size, inputs, outputs, output_grads, grads, list(arg_names), dtensors=dtensors)
    _check_against(layout, samples, where)
    return layout


def _by_slot(given, option, arg_names, samples, where):
    """{slot: Placement}, a slot being a position and, where the op names it, its name too."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise UsageProblem(f"{where}: {option}= must map argument names (or positions) to placements, e.g. "
                           f"{EXAMPLE}; got {type(given).__name__}")
    keywords = {key for sample in samples for key in sample.kwargs}
    found = {}
    for key, value in given.items():
        placement = placement_of(value, f"{where}: {option}[{key!r}]")
        if isinstance(key, int) and not isinstance(key, bool):
            count = max(len(sample.args) for sample in samples) if samples else 0
            if not 0 <= key < max(count, len(arg_names)):
                raise UsageProblem(f"{where}: {option} names position {key}, but the op takes {count} positional "
                                   f"argument(s) in the samples ({', '.join(arg_names) or 'names unknown'}): count "
                                   "from 0, or name the argument")
            found[key] = placement
            if key < len(arg_names):
                found[arg_names[key]] = placement
        elif isinstance(key, str) and (key in arg_names or key in keywords):
            found[key] = placement
            if key in arg_names:
                found[arg_names.index(key)] = placement
        else:
            known = ", ".join(arg_names) or "unknown (the op's signature cannot be read: use positions)"
            raise UsageProblem(f"{where}: {option} names {key!r}, which is not an argument of the op; its arguments "
                               f"are: {known}")
    return found


def _per_output(given, option, where):
    if given is None:
        return None
    values = list(given) if isinstance(given, (list, tuple)) else [given]
    if not values:
        raise UsageProblem(f"{where}: {option}= is empty; give one placement, or one per output")
    return [placement_of(value, f"{where}: {option}") for value in values]


def _check_against(layout, samples, where):
    """Each Shard placement names a dim its tensor has, in every sample."""
    for index, sample in enumerate(samples):
        for slot, value in list(enumerate(sample.args)) + list(sample.kwargs.items()):
            for option, placement in (("placements", layout.inputs.get(slot)), ("grad_placements",
                                                                                layout.grads.get(slot))):
                if placement is None or placement.kind != "Shard":
                    continue
                dims = getattr(value, "dim", lambda: None)()
                if dims is None:
                    raise UsageProblem(f"{where}: {option} shards `{layout.name(slot)}`, but sample {index} passes "
                                       f"{type(value).__name__} there, not a tensor")
                if not -dims <= placement.dim < dims:
                    raise UsageProblem(f"{where}: {option}: {placement} of `{layout.name(slot)}`, which has {dims} "
                                       f"dim(s) in sample {index}")
