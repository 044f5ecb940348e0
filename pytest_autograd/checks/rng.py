"""rng: the op may draw from torch's global random number generator, never reset it.

``torch.manual_seed`` or ``torch.set_rng_state`` inside forward or backward
resets every random draw after it in the whole program: dropout masks and
data shuffling repeat from step to step, silently. Drawing from the
generator is fine; overwriting it is not. The runner isolates every check
with ``fork_rng``, which hides the damage from all other checks, so this
check looks inside: it runs each sample from two different generator states
(a seed, and the same seed advanced by one draw; the first run is the
sample's plain run, shared with the checks that compare the op with itself,
``_plain_run``) and fails when the states after the call are equal, that is,
when they no longer depend on the state before it. A backward that puts the
generator back to where it was before forward (the numbers forward drew will
be drawn again) fails too.
"""

import torch

from pytest_autograd.checks._fewer_rows import judged_sample
from pytest_autograd.checks._plain_run import let_go, plain_run
from pytest_autograd.checks._reruns import generator_states, generators, seed_generators
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.execution import grads_of

HINT = ("draw from a generator of your own (g = torch.Generator(device).manual_seed(seed); torch.rand(..., "
        "generator=g)), or wrap the reseeding in `with torch.random.fork_rng():` so the caller's generator is "
        "restored; never call torch.manual_seed or torch.set_rng_state inside an op")


class GlobalRng(Check):
    name = "rng"
    description = "forward and backward never reset torch's global random number generator (manual_seed, set_rng_state)"

    def run(self, context):
        for index, sample in context.samples():
            prepared = context.prepare(judged_sample(context, index, sample))
            plain = plain_run(context, index, prepared)
            runs = [plain.states, _run_from(context, prepared, plain, 1), _run_from(context, prepared, plain, 0)]
            for generator in runs[0]["before"]:
                _judge(context, generator, runs)
            let_go(context, index)  # the last of the checks that share it, in the built-in order


def _run_from(context, prepared, plain, advance):
    """Forward and backward from the state the plain run started from, advanced by ``advance`` draws; the
    generator states seen."""
    seed_generators(context.device, plain.seed)
    for _, _, draw in generators(context.device):
        draw(advance)
    run = {"before": generator_states(context.device)}
    outputs = context.run_op(prepared)
    run["forward"] = generator_states(context.device)
    if plain.differentiable:
        grads_of(outputs, prepared.leaves, plain.cotangents)
        run["backward"] = generator_states(context.device)
    return run


def _judge(context, generator, runs):
    first, second, again = runs
    if torch.equal(first["before"][generator], second["before"][generator]):
        context.note(f"rng: {generator} could not be put in two different states before the call, so whether "
                     "the op resets it was not judged")
        return
    for phase in ("forward", "backward"):
        if phase not in first:
            return
        if torch.equal(first[phase][generator], second[phase][generator]):
            context.fail(
                f"{phase} resets torch's global random number generator: {generator}'s state after {phase} is the "
                "same whichever state it started from",
                details=["started from two different states (a seed, and the same seed advanced by one draw); "
                         f"both runs left {generator} in the same state, so every random draw after the op repeats "
                         "from call to call"],
                hint=HINT)
    for phase in ("forward", "backward"):
        if phase in first and not torch.equal(first[phase][generator], again[phase][generator]):
            context.fail(
                f"{phase} reseeds torch's global random number generator from outside torch: {generator}'s state "
                f"after {phase} differs between two runs that started from the same state",
                details=["an op that calls torch.seed() (or seeds from the clock or os.urandom) makes every later "
                         "random draw in the program irreproducible, whatever seed the user set"],
                hint=HINT)
    drew = not torch.equal(first["before"][generator], first["forward"][generator])
    if "backward" in first and drew and torch.equal(first["backward"][generator], first["before"][generator]):
        context.fail(
            f"backward rewinds torch's global random number generator: it leaves {generator} in the state it had "
            "before forward, so the random numbers forward drew are drawn again by whatever runs next",
            details=["forward advanced the generator; after backward it was back where it started"],
            hint=HINT)


check = GlobalRng()
