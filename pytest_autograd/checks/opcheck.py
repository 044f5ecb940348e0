"""opcheck: ``torch.library.opcheck`` on every sample of a registered operator.

An operator registered through ``torch.library`` (``custom_op`` or a C++
``TORCH_LIBRARY`` op) can be right in eager and still break torch.compile,
export or autograd through a wrong schema, a missing or wrong fake impl, or
autograd registered at the wrong dispatch key. opcheck finds those; this
check names which of its tests failed and how to fix each.
"""

import torch

from pytest_autograd.checks.base import Check
from pytest_autograd.engine.device_faults import raise_if_fault
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.engine.triton_interpreter import fake_tracing_refusal
from pytest_autograd.results.compare import dtype_label

# opcheck's test -> (name in reports, what it verifies)
TESTS = {
    "test_schema": ("schema", "the schema's mutation and aliasing annotations match what the kernel does"),
    "test_autograd_registration": ("autograd registration", "autograd is registered at the Autograd key"),
    "test_faketensor": ("fake tensor", "the fake impl exists and agrees with the kernel on shape, dtype, strides"),
    "test_aot_dispatch_dynamic": ("aot dispatch", "forward and backward trace under AOTDispatcher (torch.compile)"),
}

# The tests that depend on the dtype of a copy: a fake impl allocating in the default dtype fails the
# fake tensor test; aot dispatch (the slowest, ~60% of opcheck's time) adds nothing the own-dtype run missed.
OTHER_DTYPE_TESTS = ("test_faketensor",)

HINTS = [
    # (substring of the error, hint), first match wins
    ("not defined as mutable but was mutated",
     ("declare every argument the kernel writes to: custom_op(..., mutates_args=('x',)) or `Tensor(a!) x` "
      "in a TORCH_LIBRARY schema")),
    ("no fake impl",
     ("register a fake impl that returns empty tensors of the output's shape, dtype and device: "
      "@op.register_fake, or torch.library.register_fake('ns::op') for a C++ op")),
    ("mismatched tensor metadata",
     ("the fake impl's output differs from the kernel's: build it from the inputs "
      "(e.g. x.new_empty(shape), which keeps dtype and device) with the kernel's shape")),
    ("no autograd formula",
     ("register a backward: op.register_autograd(backward, setup_context=...) or "
      "torch.library.register_autograd('ns::op', ...)")),
    ("autograd kernel",
     ("register autograd at the Autograd key (register_autograd, or TORCH_LIBRARY_IMPL(ns, Autograd, m)), "
      "not an autograd.Function behind the CPU/CUDA kernel")),
    ("gradients of the operator are different",
     ("the registered backward differs under torch.compile: it must be traceable (torch ops only, "
      "no .item(), no data-dependent Python branches)")),
]


def is_library_op(op):
    from torch._ops import OpOverload, OpOverloadPacket

    kinds = [OpOverload, OpOverloadPacket]
    try:
        from torch._library.custom_ops import CustomOpDef

        kinds.append(CustomOpDef)
    except ImportError:  # older torch: no custom_op
        pass
    return isinstance(op, tuple(kinds))


def qualified_name(op):
    for attr in ("_qualname", "_qualified_op_name"):
        value = getattr(op, attr, None)
        if isinstance(value, str):
            return value
    name = getattr(op, "name", None)
    return name() if callable(name) else str(op)


class OpCheck(Check):
    name = "opcheck"
    description = ("torch.library.opcheck (schema, fake tensor, autograd registration, aot dispatch) on every "
                   "sample, and on float64 and half-precision copies of the first")

    def applies(self, case, device):
        if not is_library_op(case.op):
            return ("op is not a torch.library operator (custom_op or TORCH_LIBRARY op); "
                    "opcheck needs one, e.g. op=torch.ops.my_ns.my_op")
        if not hasattr(torch.library, "opcheck"):
            return f"torch {torch.__version__} has no torch.library.opcheck (added in 2.4)"
        return None

    def run(self, context):
        checked = []
        for index, sample in context.samples():
            runs = [(None, sample)] + (other_dtype_copies(sample) if index == 0 else [])
            for dtype, copy in runs:
                prepared = context.prepare(copy)
                args, kwargs = prepared.call_args()
                op = resolve_overload(context.case.op, args, kwargs)
                if dtype is not None and not _runs_in(op, prepared):
                    continue  # the op's kernel refuses this dtype: nothing for a fake impl to match
                tests = TESTS if dtype is None else OTHER_DTYPE_TESTS
                results = torch.library.opcheck(op, tuple(args), kwargs, test_utils=tuple(tests),
                                                raise_exception=False)
                checked.append(dtype_label(context.dtype) if context.dtype is not None else "non-floating")
                failed = [(test, error) for test, error in _ordered(results) if not _passed(error)]
                for test, error in list(failed):
                    refusal = fake_tracing_refusal(error)
                    if refusal:
                        failed.remove((test, error))
                        context.note(f"{test} not judged: {refusal}")
                if failed:
                    _report(context, op, failed, dict.fromkeys(checked))


def other_dtype_copies(sample):
    """(dtype, copy) of ``sample`` in float64, float16 and bfloat16, leaving out its own dtype.

    A fake impl that allocates in the default dtype matches the kernel only
    for float32 samples; the copies show it.
    """
    from pytest_autograd.checks._transforms import cast_sample

    own = next((value.dtype for value in sample.values()
                if isinstance(value, torch.Tensor) and value.is_floating_point()), None)
    if own is None:  # nothing to cast (complex and integer tensors keep their dtype)
        return []
    return [(dtype, cast_sample(sample, dtype)) for dtype in (torch.float64, torch.float16, torch.bfloat16)
            if dtype != own]


def _runs_in(op, prepared):
    """True when the op's kernel accepts the prepared (cast) arguments."""
    args, kwargs = prepared.call_args()
    try:
        with torch.no_grad():
            op(*args, **kwargs)
    except Exception as error:  # a dtype the kernel has no implementation for; a GPU fault is no such refusal
        raise_if_fault(error)
        return False
    return True


def resolve_overload(op, args, kwargs):
    """The overload of an OpOverloadPacket that ``op(*args, **kwargs)`` dispatches to.

    opcheck only takes a packet with a single overload; ``torch.ops.aten.sin``
    has six. The overload actually called is recorded by a dispatch mode;
    ``.default`` is the fallback. Anything else is returned unchanged.
    """
    from torch._ops import OpOverloadPacket

    if not isinstance(op, OpOverloadPacket) or len(op.overloads()) <= 1:
        return op
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        found = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if Record.found is None and getattr(func, "overloadpacket", None) is op:
                Record.found = func
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), Record():
            op(*args, **kwargs)
    except Exception as error:  # opcheck itself reports the op raising, unless the GPU faulted
        raise_if_fault(error)
    if Record.found is not None:
        return Record.found
    if "default" in op.overloads():
        return op.default
    skip(f"{qualified_name(op)} has overloads {', '.join(o or 'default' for o in op.overloads())} and the samples "
         "do not dispatch to one of them by name; pass the overload itself, e.g. op=torch.ops.ns.op.default")


def _ordered(results):
    known = [(test, results[test]) for test in TESTS if test in results]
    return known + [(test, error) for test, error in results.items() if test not in TESTS]


def _passed(result):
    return isinstance(result, str) and result == "SUCCESS"


def _essence(error):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= 300 else text[:297] + "..."


def _hint(error):
    text = str(error).lower()
    for needle, hint in HINTS:
        if needle in text:
            return hint
    return None


def _report(context, op, failed, checked):
    names = [TESTS.get(test, (test, ""))[0] for test, _ in failed]
    details, seen = [], {}
    for (test, error), name in zip(failed, names):
        essence = f"{type(error).__name__}: {_essence(error)}"
        if essence in seen:
            details.append(f"{name} ({test}): same error as {seen[essence]}")
            continue
        seen[essence] = name
        checks = TESTS.get(test, (test, ""))[1]
        details.append(f"{name} ({test}{': checks ' + checks if checks else ''}): {essence}")
    if len(checked) > 1:
        details.append(f"opcheck ran in: {', '.join(checked)} (the last one failed)")
    hint = next((h for h in (_hint(error) for _, error in failed) if h), None)
    context.fail(f"opcheck failed for {qualified_name(op)}: {', '.join(names)}", details=details, hint=hint)


check = OpCheck()
