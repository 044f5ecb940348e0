"""The model run again at other input sizes, so that each op's sizes are judged where the model calls it.

An op inside a model is called at the sizes the model makes: a rotary
embedding gets the head dim the model's config fixes, whatever the batch or
the sequence. Sizes derived from the captured call (an odd head dim) would
judge the op where the model never calls it, and fail a correct op written
for even head dims. So the scan does not invent sizes for a scanned op: it
runs the model again with the dims of its own inputs changed (a batch of
one, odd and tail lengths, a length spanning several blocks), records the
arguments each op receives there, and hands them to the checks that judge
sizes (``size_samples=``). A change the model refuses (its forward raises,
or its backward where the captured run's did not) is simply not used; a dim
of an op's argument that no run changed is fixed by the architecture and is
never varied.

Each distinct size (2 or more) of the inputs' tensors is changed
consistently, in every dim of every input that has it (``input_ids`` and
``attention_mask`` keep matching). The calls of an op in a run are paired
with the captured ones by order: the n-th call of the op at other sizes is
the n-th call at the user's (same code, same order), where the run made as
many calls of it with the same arguments' ranks, dtypes and requires_grad
pattern; otherwise that run says nothing about the op.
"""

import math
import time
from dataclasses import dataclass, field

import torch

from pytest_autograd.engine.case import Sample
from pytest_autograd.engine.model_capture import ModelRaised, capture_model

LARGE_FLOOR = 2048  # the several-blocks size is max(4 n, this) + 3: past blocks of up to 1024
LARGE_ELEMENTS = 1 << 18  # ... made smaller while an input would exceed this many elements ...
LARGE_RUN_SECONDS = 0.5  # ... or while the model's forward and backward there would take longer (from the other runs)
NOISE = 0.05  # a repeated floating input's copies move this fraction of its spread: no exact ties between copies


@dataclass
class SizeRun:
    """The model's custom op calls when its inputs' size ``old`` is ``new``."""

    old: int
    new: int
    inputs: str  # the changed inputs' shapes: "`x` [2, 9, 12]"
    capture: object  # model_capture.Capture

    def origin(self):
        return (f"the model calls the op with these arguments when its inputs are {self.inputs} (size {self.old} of "
                f"its inputs made {self.new})")


@dataclass
class ModelSizes:
    """The captured calls and the runs at other input sizes: the arguments each op gets at each."""

    capture: object
    runs: list = field(default_factory=list)  # [SizeRun]
    refused: list = field(default_factory=list)  # [(old, new, why)]: changes the model raised at, not used
    notes: list = field(default_factory=list)  # what the scan's report says of them: the runs that crashed

    def samples_for(self, scanned, signature):
        """[(Sample, origin)]: the arguments ``signature``'s captured call gets in each run where they differ from
        the captured ones, each shape once, in the order of the runs."""
        captured = [c for c in self.capture.calls if c.key == scanned.key]
        position = next(index for index, c in enumerate(captured) if c is signature.call)
        found = {}
        for run in self.runs:
            call = _paired([c for c in run.capture.calls if c.key == scanned.key], len(captured), position,
                           signature.call)
            if call is not None and call.signature != signature.key and call.signature not in found:
                found[call.signature] = (Sample(*call.args, **call.kwargs), run.origin())
        return list(found.values())


def model_sizes(model, calls, capture, seed=0, isolate="explore"):
    """The model run again with each distinct size of its inputs changed (a ModelSizes); ``capture`` is the
    capture at the user's inputs. Unless ``isolate`` is "off", each run happens in the sandbox process
    (``engine.processes``), so that a kernel crashing at a size the plugin chose ends that process, not the
    session (the size is then not used, saying so)."""
    sizes = ModelSizes(capture)
    names = input_names(model)
    pace = (0, None)  # (input elements, seconds) of the largest run so far: how long a larger one would take
    distinct = sorted({size for call in calls for value in _tensors(call) for size in value.shape if size >= 2})
    plan = [(old, new) for old in distinct for new in small_changes(old)]
    plan += [(old, None) for old in distinct]  # several blocks last: its size comes from the others' pace
    for old, new in plan:
        if new is None:
            if not any(run.old == old for run in sizes.runs):  # the model accepts no other size there
                continue
            new = several_blocks(old, calls, pace)
            if new is None:
                continue
        changed = [_changed(call, old, new, seed) for call in calls]
        start = time.perf_counter()
        try:
            run = _capture(model, changed, seed, isolate)
        except ModelRaised as raised:
            sizes.refused.append((old, new, str(raised).splitlines()[0]))
            if isinstance(raised, ModelCrashed):
                sizes.notes.append(f"sizes: the model was not run with size {old} of its inputs made {new}: {raised}")
            continue
        if run.backward not in ("ran", "none") and capture.backward in ("ran", "none"):
            sizes.refused.append((old, new, f"the model's backward raised {run.backward}"))
            continue
        elements = sum(_elements(call) for call in changed)
        if elements >= pace[0]:
            pace = (elements, time.perf_counter() - start)
        sizes.runs.append(SizeRun(old, new, _describe_inputs(changed, calls, old, names), run))
    return sizes


RUN_SECONDS = 120.0  # a model run at other sizes that takes longer in the sandbox is stopped, and the size not used


def _capture(model, calls, seed, isolate):
    """``capture_model`` of the model at other input sizes, in the sandbox unless ``isolate`` is "off" or the model
    cannot be sent there; a crash or a hang there raises ModelRaised, naming it."""
    if isolate == "off":
        return capture_model(model, calls, seed=seed)
    from pytest_autograd.engine.processes import sandbox, transport

    try:
        transport.dumps(model)
    except Exception:  # noqa: BLE001 - a model defined where it cannot be imported again: run here
        return capture_model(model, calls, seed=seed)
    outcome = sandbox().run(capture_model, model, calls, seed, timeout=RUN_SECONDS)
    if outcome.returned:
        return outcome.value
    if outcome.unsent:
        return capture_model(model, calls, seed=seed)
    if outcome.raised is not None:
        raise ModelRaised(outcome.raised.message)
    if outcome.hung is not None:
        raise ModelCrashed(f"it did not return within {RUN_SECONDS:.0f} s there, in the sandbox process")
    frame = outcome.crash.crashed_frame()
    raise ModelCrashed(f"it crashed the sandbox process ({outcome.crash.signal_name}) there"
                       + (f", at {frame}" if frame else "") + "; the session went on")


class ModelCrashed(ModelRaised):
    """The model's run at other sizes crashed or hung the sandbox process."""


def judges_sizes(registry, names):
    """Whether one of the checks ``names`` judges an op at other sizes (it takes ``size_samples=``): only then is
    the model run again."""
    return any("size_samples" in (getattr(registry.get(name), "options", None) or {}) for name in names)


def small_changes(size):
    """The sizes an input size is tried at before the large one, the most telling first: size + 1 and size - 1
    (tails), 1 (a batch of one), an odd size just past a power of two."""
    power = 1
    while power + 1 <= size + 1:
        power *= 2
    return [new for new in dict.fromkeys([size + 1, size - 1, 1, power + 1]) if new >= 1 and new != size]


def several_blocks(size, calls, pace):
    """A size spanning several blocks (max(4 n, 2048) + 3), made smaller while an input would exceed
    LARGE_ELEMENTS or the run would take over LARGE_RUN_SECONDS at the pace of the largest run so far (``pace``:
    its input elements and seconds); None when that leaves none above 2 n + 1."""
    if pace[1] is None:
        return None
    per_element = pace[1] / max(1, pace[0])

    def fits(new):
        changed = [[math.prod(new if s == size else s for s in value.shape) for value in _tensors(call)]
                   for call in calls]
        largest = max((n for shapes in changed for n in shapes), default=0)
        return largest <= LARGE_ELEMENTS and sum(map(sum, changed)) * per_element <= LARGE_RUN_SECONDS

    new = max(4 * size, LARGE_FLOOR) + 3
    if fits(new):
        return new
    low, high = size, new
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    new = (low - 3) // 8 * 8 + 3  # 3 past a multiple of 8: a partial block for any power-of-two block
    return new if new > 2 * size + 1 else None


def input_names(model):
    """The names of the model's positional inputs (``forward``'s), for the reports."""
    import inspect

    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _changed(call, old, new, seed):
    """``call`` (a Sample) with every dim of size ``old`` of its tensors made ``new``."""
    generator = torch.Generator().manual_seed(seed)

    def change(slot, value):
        if not isinstance(value, torch.Tensor):
            return value
        for dim, size in enumerate(value.shape):
            if size == old:
                value = _resized(value.detach(), dim, new, generator)
        return value

    return call.map(change)


def _resized(tensor, dim, new, generator):
    """``tensor`` with ``dim`` at ``new``: its leading slice, or itself repeated along ``dim``, the floating values of
    the copies past the first moved a little (a repeated sequence has no exact ties with itself)."""
    old = tensor.shape[dim]
    if new <= old:
        return tensor.narrow(dim, 0, new).clone()
    repeats = [1] * tensor.dim()
    repeats[dim] = -(-new // old)
    grown = tensor.repeat(repeats).narrow(dim, 0, new).clone()
    if grown.is_floating_point() and grown.numel():
        spread = float(tensor.double().std()) if tensor.numel() > 1 else 1.0
        noise = torch.randn(grown.shape, generator=generator, dtype=torch.float64).to(grown.device, grown.dtype)
        copies = grown.narrow(dim, old, new - old)
        copies.add_(noise.narrow(dim, old, new - old), alpha=NOISE * (spread if math.isfinite(spread) else 1.0))
    return grown


def _describe_inputs(changed, calls, old, names):
    """"`x` [2, 9, 12]": the changed tensors of the first call that has the size."""
    for before, after in zip(calls, changed):
        parts = []
        for slot, value in zip(before.slots(), before.values()):
            if isinstance(value, torch.Tensor) and old in value.shape:
                name = slot if isinstance(slot, str) else (names[slot] if slot < len(names) else f"input {slot}")
                shape = dict(zip(after.slots(), after.values()))[slot].shape
                parts.append(f"`{name}` {list(shape)}")
        if parts:
            return ", ".join(parts)
    return "its inputs"


def _paired(calls, count, position, captured):
    """The call among ``calls`` (a run's calls of one op) paired with ``captured``, the op's call at ``position``
    of ``count`` in the capture, with its arguments (a repeat's are those of the call it repeats); None when the run
    made another number of calls of the op, or that call's arguments differ in kind."""
    if len(calls) != count:  # the model's control flow depends on the sizes: no call is known to be the same
        return None
    call = calls[position]
    if call.grad_slots != captured.grad_slots or not _same_kinds(call.signature, captured.signature):
        return None
    if not call.kept:
        call = next((c for c in calls if c.kept and c.signature == call.signature and c.grad_slots == call.grad_slots),
                    None)
    return call


def _same_kinds(signature, captured):
    """Same slots; tensors of the same rank, dtype and device; other values of the same type."""
    if [slot for slot, _ in signature] != [slot for slot, _ in captured]:
        return False
    for (_, value), (_, other) in zip(signature, captured):
        if value[0] != other[0]:
            return False
        if value[0] == "tensor" and (len(value[1]) != len(other[1]) or value[2:] != other[2:]):
            return False
    return True


def _tensors(sample):
    return [value for value in sample.values() if isinstance(value, torch.Tensor)]


def _elements(sample):
    return sum(value.numel() for value in _tensors(sample))

