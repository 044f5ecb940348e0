"""OpCase and Sample: what the marker's op and the test body's samples become.

Samples are validated here with messages that name the mistake and the fix,
so that bad input never surfaces as a traceback from inside torch. The
marker's own arguments are validated in ``marker``. This module imports
torch only inside functions.
"""

import inspect
from dataclasses import dataclass, field
from typing import Optional

from pytest_autograd.engine.defaults import DEFAULT_SECONDS, DEFAULT_SHRINK_SECONDS  # noqa: F401 - re-exported
from pytest_autograd.engine.distributed import OPTIONS as DISTRIBUTED_OPTIONS
from pytest_autograd.engine.exploration import variants
from pytest_autograd.engine.outcomes import UsageProblem


class Sample:
    """One call's arguments: ``Sample(x, weight, bias=None)``."""

    def __init__(self, *args, **kwargs):
        self.args = tuple(args)
        self.kwargs = dict(kwargs)

    def values(self):
        """Every argument, positional then keyword."""
        return [*self.args, *self.kwargs.values()]

    def slots(self):
        """Where each argument goes, in the order of ``values()``: positions, then keyword names."""
        return [*range(len(self.args)), *self.kwargs]

    def replace(self, args=None, kwargs=None):
        return Sample(*(self.args if args is None else args), **(self.kwargs if kwargs is None else kwargs))

    def map(self, change):
        """A Sample with each argument replaced by ``change(slot, value)`` (slot: position or keyword name)."""
        return self.replace(args=[change(slot, value) for slot, value in enumerate(self.args)],
                            kwargs={slot: change(slot, value) for slot, value in self.kwargs.items()})

    def __repr__(self):
        parts = [_describe(a) for a in self.args] + [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]
        return f"Sample({', '.join(parts)})"


def _describe(value):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"tensor{list(shape)}:{str(dtype).replace('torch.', '')}"
    return repr(value)


# Marker options understood by the core; checks may declare more.
CORE_OPTIONS = {
    "op": None,
    "reference": None,
    "checks": None,
    "skip": None,
    "devices": None,
    "double_backward": True,
    "atol": None,
    "rtol": None,
    # Floating tensor arguments that are constants, not differentiated (e.g.
    # batch_norm's running statistics), by name or position.
    "constants": None,
    # Arguments the op writes in place on purpose (running statistics, a memory-saving backward's saved
    # inputs): the mutation check allows them, and every other check keeps its evidence from them.
    "mutates": None,
    # Where a crash of the op cannot end the run, for this test (engine/exploration: "explore", "all", "off").
    "isolate": None,
    # An op that talks to other ranks: run on world_size ranks of a process group (engine/distributed).
    **DISTRIBUTED_OPTIONS,
}


@dataclass
class RunOptions:
    """What the caller decides for every check of a run: pytest's options under the plugin, ``run_checks``'
    arguments elsewhere."""

    seconds: Optional[float] = DEFAULT_SECONDS  # each check's time budget; None: no limit
    devices: tuple = ("cpu",)  # the run's devices: parity chooses its ground truth among them
    bench: object = None  # the bench session's state (pytest_autograd.bench.state.BenchState); None: benchmarks off
    shrink_seconds: Optional[float] = DEFAULT_SHRINK_SECONDS  # shrinking a failing sample; None or 0: off
    repro_dir: Optional[str] = None  # where a failure's stand-alone script is written; None: not written
    checks: Optional[tuple] = None  # the checks run on each case, in order (run_checks); None: one check a case
    # Where a crash of the op cannot end the run (engine/exploration): "explore" runs the checks that explore inputs
    # the user did not give (and the inputs they make up for the others: cut batches, shrunk samples) in the
    # sandbox process; "all" runs every check there; "off" runs everything here, where a crash ends the run
    isolate: str = "explore"


@dataclass
class OpCase:
    """An op under test, its samples, optional reference and marker options."""

    op: object
    samples: list
    reference: object = None
    options: dict = field(default_factory=dict)
    arg_names: list = field(default_factory=list)
    name: str = "op"
    # What the caller decided for the whole run, and a callable re-running the
    # test body with some arguments overridden, e.g. ``factory(size=4096)``.
    run_options: "RunOptions" = None
    factory: object = None
    # Slots (positions and keyword names) of the arguments in ``constants=``.
    constant_slots: frozenset = frozenset()
    # Names the cases one test makes (pytest: one per check and device, each from its own run of the test body),
    # so that facts about the op, e.g. whether it runs in float64, are found once per test; None: this case only.
    shared_by: object = None
    # The seed of the work the checks of one run_checks call compute once for all of them (see
    # checks/_first_order); None: each check's own seed.
    shared_seed: object = None
    # Where the sandbox finds the op when it cannot be sent itself (a lambda on the marker): a
    # processes.transport.FromTestMarker; None outside pytest.
    origin: object = None

    def call(self, *args, **kwargs):
        if variants.active() is not None:  # a check judging the op: each new kind of call is tried elsewhere first
            from pytest_autograd.engine.exploration.isolation import before_call

            before_call(self, args, kwargs)
        return call_op(self.op, args, kwargs)

    def call_reference(self, *args, **kwargs):
        return self.reference(*args, **kwargs)

    def arg_name(self, position):
        """Name of positional argument ``position`` (an int) or keyword (a str)."""
        if isinstance(position, str):
            return position
        if position < len(self.arg_names):
            return self.arg_names[position]
        return f"arg{position}"

    def option(self, name, default=None):
        value = self.options.get(name)
        return default if value is None else value

    @property
    def is_function(self):
        return is_autograd_function(self.op)


def is_autograd_function(op):
    from torch.autograd import Function

    return inspect.isclass(op) and issubclass(op, Function)


def call_op(op, args, kwargs):
    if is_autograd_function(op):
        return op.apply(*args, **kwargs)
    return op(*args, **kwargs)


def op_display_name(op):
    """The op's name as its author knows it (see :mod:`pytest_autograd.results.naming`)."""
    from pytest_autograd.results.naming import display_name

    return display_name(op)


def argument_names(op):
    """Names of the op's positional arguments, as its author wrote them."""
    schema = _schema_of(op)
    if schema is not None:
        return [argument.name for argument in schema.arguments if not getattr(argument, "kwarg_only", False)]
    target = op
    drop_ctx = False
    owner = getattr(op, "__self__", None)  # ``MyFunction.apply``, bound to its class: named by its forward
    if getattr(op, "__name__", None) == "apply" and is_autograd_function(owner):
        op = owner
    if is_autograd_function(op):
        from torch.autograd import Function

        target = op.forward
        drop_ctx = getattr(op, "setup_context", None) is getattr(Function, "setup_context", None)
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    if drop_ctx and parameters:
        parameters = parameters[1:]
    names = []
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.KEYWORD_ONLY):
            break
        names.append(parameter.name)
    return names


def _schema_of(op):
    """The operator schema behind ``op``, so arguments are named as the schema names them.

    A torch.ops overload has its own; an overload packet lends its tensor
    overload's (``torch.ops.aten.mul`` -> ``mul.Tensor(self, other)``); a
    ``torch.*`` builtin its aten namesake's. None for anything else.
    """
    candidates = [op, getattr(op, "_opoverload", None)]
    overloads = getattr(op, "overloads", None)
    if callable(overloads) and type(op).__name__ == "OpOverloadPacket":
        try:
            names = list(overloads())
        except Exception:  # an odd packet: no names
            names = []
        candidates += sorted((getattr(op, name, None) for name in names), key=_overload_preference)[:1]
    if type(op).__name__ == "builtin_function_or_method" and (getattr(op, "__module__", "") or "").startswith("torch"):
        import torch

        packet = getattr(torch.ops.aten, getattr(op, "__name__", ""), None) if hasattr(torch.ops, "aten") else None
        if packet is not None and packet is not op:
            return _schema_of(packet)
    for candidate in candidates:
        schema = getattr(candidate, "_schema", None)
        if schema is not None and hasattr(schema, "arguments"):
            return schema
    return None


def _overload_preference(overload):
    """Overloads on tensors (first argument ``self``) first: ``Tensor``, then ``default``, then any.

    ``aten.mul.default`` is the scalar ``mul(Scalar a, Scalar b)``; ``aten.mul.Tensor`` is what a tensor call uses.
    """
    name = getattr(overload, "_overloadname", "")
    schema = getattr(overload, "_schema", None)
    first = schema.arguments[0].name if schema is not None and schema.arguments else ""
    return (first != "self", name != "Tensor", name != "default", name)


def is_once_differentiable(op):
    """True when the Function's backward is wrapped by ``@once_differentiable``."""
    backward = getattr(op, "backward", None)
    code = getattr(backward, "__code__", None)
    if code is None:
        return False
    return code.co_name == "wrapper" and code.co_filename.replace("\\", "/").endswith("torch/autograd/function.py")


def normalise_samples(returned, where):
    """Turn what the test body returned into a non-empty list of Samples."""
    import torch

    if returned is None:
        raise UsageProblem(
            f"{where}: the test body returned None; a test marked autograd_op must "
            "`return` its samples: one tuple of arguments, a Sample, or a list of them."
        )
    if isinstance(returned, (Sample, tuple, torch.Tensor)):
        items = [returned]
    elif isinstance(returned, list):
        items = returned
    else:
        raise UsageProblem(
            f"{where}: the test body returned {type(returned).__name__}; return one tuple "
            "of arguments, a Sample, or a list of them."
        )
    if not items:
        raise UsageProblem(f"{where}: the test body returned an empty list: there are no samples to check.")
    if len(items) > 1 and all(isinstance(item, torch.Tensor) for item in items):
        raise UsageProblem(
            f"{where}: the test body returned a list of {len(items)} tensors, which is ambiguous; return a tuple "
            "for one call's arguments, `return (x, w, b)`, or a list of tuples for several samples, "
            "`return [(x,), (y,)]`."
        )
    samples = []
    for index, item in enumerate(items):
        if isinstance(item, Sample):
            sample = item
        elif isinstance(item, tuple):
            sample = Sample(*item)
        elif isinstance(item, torch.Tensor):
            sample = Sample(item)
        elif type(item).__module__ == "numpy":
            raise UsageProblem(
                f"{where}: sample {index} is a numpy {type(item).__name__}; pass torch tensors "
                "(torch.from_numpy(array)) inside a tuple of the op's arguments."
            )
        else:
            raise UsageProblem(
                f"{where}: sample {index} is a {type(item).__name__}; each sample must be a tuple "
                "of the op's arguments (tensors, numbers or None) or a pytest_autograd.Sample."
            )
        _validate_sample(sample, index, where)
        samples.append(sample)
    return samples


def _validate_sample(sample, index, where):
    import torch

    values = sample.values()
    for position, value in enumerate(values):
        if type(value).__module__ == "numpy" and hasattr(value, "shape"):
            raise UsageProblem(
                f"{where}: sample {index} argument {position} is a numpy array; "
                "pass torch tensors (torch.from_numpy(array))."
            )
    for position, value in enumerate(values):
        if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
            raise UsageProblem(
                f"{where}: sample {index} argument {position} is a {type(value).__name__} of tensors; only "
                "top-level tensor arguments are differentiated. Check a wrapper that takes them one by one, "
                "e.g. op=lambda a, b: torch.cat([a, b]) with samples (a, b)."
            )
    if not any(isinstance(value, torch.Tensor) for value in values):
        raise UsageProblem(
            f"{where}: sample {index} ({sample!r}) has no tensor arguments; "
            "a sample is the op's arguments, with at least one torch.Tensor."
        )


def build_case(mark_kwargs, samples, where="autograd_check"):
    from pytest_autograd.engine.modules import module_options, with_parameters
    from pytest_autograd.engine.sample_values import validate_sample_values

    mark_kwargs = module_options(mark_kwargs)
    op = mark_kwargs["op"]
    samples = with_parameters(op, samples)
    arg_names = argument_names(op)
    case = OpCase(
        op=op,
        samples=samples,
        reference=mark_kwargs.get("reference"),
        options=dict(mark_kwargs),
        arg_names=arg_names,
        name=op_display_name(op),
        constant_slots=_constant_slots(mark_kwargs.get("constants"), arg_names, samples),
    )
    validate_sample_values(case, where)
    _validate_isolate(mark_kwargs.get("isolate"), where)
    _refuse_layout_without_world(mark_kwargs, where)
    if mark_kwargs.get("world_size") is not None:  # the op on several ranks, as one op on the global tensors
        from pytest_autograd.engine.distributed import across_ranks

        case.op = across_ranks(mark_kwargs, arg_names, samples, where)
    return case


def _refuse_layout_without_world(mark_kwargs, where):
    """Placements without ``world_size=`` would run the op in one process, where its collectives have no group."""
    if mark_kwargs.get("world_size") is not None:
        return
    from pytest_autograd.engine.distributed import given_options

    given = given_options(mark_kwargs)
    if given:
        raise UsageProblem(f"{where}: {', '.join(given)}= describe ranks, but there is no world_size=: add "
                           "world_size=N (the number of ranks to run the op on), e.g. world_size=2")


def _validate_isolate(value, where):
    from pytest_autograd.engine.isolate_modes import isolate_problem

    problem = None if value is None else isolate_problem(value, f"{where}: isolate=")
    if problem:
        raise UsageProblem(problem)


def _constant_slots(constants, arg_names, samples):
    """Resolve ``constants=`` (names or positions) to argument slots."""
    if constants is None:
        return frozenset()
    entries = [constants] if isinstance(constants, (str, int)) else list(constants)
    keywords = {key for sample in samples for key in sample.kwargs}
    slots = set()
    for entry in entries:
        if isinstance(entry, int) and not isinstance(entry, bool):
            slots.add(entry)
            if entry < len(arg_names):
                slots.add(arg_names[entry])
        elif isinstance(entry, str) and (entry in arg_names or entry in keywords):
            slots.add(entry)
            if entry in arg_names:
                slots.add(arg_names.index(entry))
        else:
            known = ", ".join(arg_names) or "unknown (the op's signature cannot be read; use positions)"
            raise UsageProblem(
                f"constants={constants!r} names {entry!r}, which is not an argument of the op; "
                f"its arguments are: {known}."
            )
    return frozenset(slots)


def validate_tolerances(options, where):
    """``atol=``/``rtol=`` must be finite and non-negative: NaN or inf would make every comparison pass."""
    import math

    for option in ("atol", "rtol"):
        value = options.get(option)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageProblem(f"{where}: {option}= must be a non-negative number, got {value!r}.")
        if not math.isfinite(value):
            raise UsageProblem(
                f"{where}: {option}={value!r} would make every comparison pass (an error is never greater than "
                f"it, or never compared at all); give a finite non-negative number, e.g. {option}=1e-4."
            )
