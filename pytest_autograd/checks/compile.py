"""compile: ``torch.compile(op)`` agrees with eager in outputs and gradients.

Eager never runs a custom op's fake impl and never notices an undeclared
mutation; inductor plans buffers from the former and reorders around the
latter, so such bugs show only as silently different numbers once compiled.
Graph breaks are named (reason and the user's line) from
``torch._dynamo.explain``; with ``compile_fullgraph=True`` they fail the check,
otherwise they are reported as a warning.

Opt-in (``default = False``): with the default inductor backend one op costs
seconds of compilation on CPU (see docs/checks/compile.md for measurements).
"""

import linecache
import re
import warnings

import torch

from pytest_autograd.checks._pairs import compare_runs
from pytest_autograd.checks.base import Check
from pytest_autograd.engine.device_faults import raise_if_fault
from pytest_autograd.engine.execution import OpRaised
from pytest_autograd.engine.outcomes import skip
from pytest_autograd.engine.triton_interpreter import fake_tracing_refusal
from pytest_autograd.results.report import CheckFailure

MISMATCH_HINT = ("eager and compiled code disagree: typical causes are a custom op's fake impl that differs "
                 "from its kernel in shape, dtype or strides (run the opcheck check), an input mutated but not "
                 "declared (mutates_args / Tensor(a!)), or random numbers drawn inside the op")
# Newer inductors check a custom op's outputs against what its fake impl promised and raise
# (torch 2.15: "expected dtype torch.float32 but got torch.float64") where older ones computed garbage.
FAKE_ASSERTION = re.compile(r"^expected (dtype|size|stride)\b")
BREAK_HINT = ("fullgraph=True needs the op traceable end to end: avoid .item()/.tolist(), print, and Python "
              "`if` on tensor values (use torch.where); or pass compile_fullgraph=False to accept the breaks")


class GraphBreakWarning(UserWarning):
    """torch.compile split the op into several graphs (the op still matched eager)."""


class Compile(Check):
    name = "compile"
    description = "torch.compile(op) matches eager in outputs and gradients; graph breaks are named"
    default = False
    options = {"compile_backend": "inductor", "compile_fullgraph": False}

    def applies(self, case, device):
        if not hasattr(torch, "compile"):
            return "this torch has no torch.compile"
        return None

    def run(self, context):
        import torch._dynamo

        case = context.case
        backend = case.option("compile_backend", "inductor")
        fullgraph = bool(case.option("compile_fullgraph", False))
        target = case.op.apply if case.is_function else case.op

        def fn(*args, **kwargs):
            return target(*args, **kwargs)

        breaks = []
        for index, sample in context.samples():
            eager = context.prepare(sample)
            explained = context.prepare(sample)
            sample_breaks = _graph_breaks(fn, explained)
            breaks.extend(b for b in sample_breaks if b not in breaks)
            torch._dynamo.reset()
            compiled_fn = torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=False)
            compiled = context.prepare(sample)
            label = f"torch.compile(op{', fullgraph=True' if fullgraph else ''})"
            try:
                got = context.run_op(compiled, fn=compiled_fn)
            except OpRaised as raised:
                _fail_raised(context, label, raised.error, sample_breaks, fullgraph)
            try:
                compare_runs(context, (eager, context.run_op(eager)), (compiled, got),
                             expected_label="eager", got_label=label)
            except CheckFailure as failure:
                failure.report.hint = failure.report.hint or MISMATCH_HINT
                failure.report.details.extend(f"graph break: {b}" for b in sample_breaks)
                failure.report.details.append(f"backend: {backend}")
                raise
            except OpRaised as raised:
                if raised.phase != "backward":
                    raise
                _fail_raised(context, f"the backward of {label}", raised.error, sample_breaks, fullgraph)
        torch._dynamo.reset()
        if breaks:
            warnings.warn(GraphBreakWarning(
                f"compile: torch.compile({case.name}) has {len(breaks)} graph break(s): " + "; ".join(breaks)
                + ". Pass compile_fullgraph=True to make them failures."), stacklevel=2)


def _graph_breaks(fn, prepared):
    """'reason (file:line: code)' for each graph break torch._dynamo.explain finds."""
    import torch._dynamo

    args, kwargs = prepared.call_args()
    try:
        explanation = torch._dynamo.explain(fn)(*args, **kwargs)
    except Exception as error:  # the compiled run reports the error itself, unless the GPU faulted
        raise_if_fault(error)
        return []
    found = []
    for reason in getattr(explanation, "break_reasons", []):
        text = (str(getattr(reason, "reason", reason)).strip().splitlines() or [""])[0]
        stack = [frame for frame in (getattr(reason, "user_stack", None) or []) if not _internal(frame.filename)]
        if stack:
            frame = stack[-1]
            code = linecache.getline(frame.filename, frame.lineno).strip()
            text = f"{text} at {frame.filename}:{frame.lineno} in {frame.name}" + (f": `{code}`" if code else "")
        if text not in found:
            found.append(text)
    return found


def _internal(path):
    path = path.replace("\\", "/")
    return "/torch/" in path or "/pytest_autograd/" in path


def _essence(error):
    """The first line of a torch.compile error, its Explanation line and the user's frame."""
    lines = [line.rstrip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return [type(error).__name__]
    picked = [lines[0]]
    picked += [line.strip() for line in lines[1:] if line.strip().startswith("Explanation:")][:1]
    for i, line in enumerate(lines):
        if line.strip().startswith("File ") and not _internal(line):
            picked.append("at " + line.strip() + (f": `{lines[i + 1].strip()}`" if i + 1 < len(lines) else ""))
    return picked[:4]


def _fail_raised(context, label, error, sample_breaks, fullgraph):
    refusal = fake_tracing_refusal(error)
    if refusal:
        skip(refusal)
    essence = _essence(error)
    is_break = fullgraph and (sample_breaks or type(error).__name__ in ("Unsupported", "UserError"))
    if sample_breaks:  # they name the user's line already
        essence = [line for line in essence if not line.startswith("at ")]
    details = essence[1:] + [f"graph break: {b}" for b in sample_breaks]
    hint = BREAK_HINT if is_break else MISMATCH_HINT if FAKE_ASSERTION.match(essence[0]) else None
    context.fail(f"{label} raised {type(error).__name__}: {essence[0]}", details=details, hint=hint)


check = Compile()
