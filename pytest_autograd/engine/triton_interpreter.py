"""Triton's interpreter (``TRITON_INTERPRET=1``): what the plugin says and refuses under it.

Under the interpreter, ``@triton.jit`` kernels run on CPU tensors through
numpy, one program at a time: right for every correctness check, which only
needs the kernel's numbers, and meaningless for timing. The header says the
interpreter is on; the bench check refuses to time an op that launches
interpreted kernels. Imports neither torch nor triton: ``plugin.py`` uses it
for the header.
"""

import os
import sys
from contextlib import contextmanager

ENV = "TRITON_INTERPRET"
_TRUE = ("1", "true", "on", "yes")

BENCH_REFUSAL = (f"{ENV}=1: the op launches Triton kernels, which run in Triton's numpy interpreter here, so a "
                 "timing would measure the interpreter, not the kernel; benchmark on a GPU without " + ENV)


def interpreter_on():
    """True when ``TRITON_INTERPRET`` is set to a true value (as Triton reads it)."""
    return os.environ.get(ENV, "").strip().lower() in _TRUE


def header_line():
    """The report-header line for the interpreter, or None when it is off."""
    if not interpreter_on():
        return None
    return (f"autograd: {ENV}=1, Triton kernels run in Triton's CPU interpreter: every check judges their "
            "numbers, bench refuses to time them")


@contextmanager
def counting_interpreted_launches():
    """Counts interpreted kernel launches in the block: yields a one-element list, or None if unknowable.

    None means triton is imported but its interpreter is not laid out as
    expected (another triton version): callers then assume kernels ran.
    """
    module = sys.modules.get("triton.runtime.interpreter")
    executor = getattr(module, "GridExecutor", None) if module is not None else None
    original = getattr(executor, "__dict__", {}).get("__call__")
    if original is None:
        yield None
        return
    count = [0]

    def launch(self, *args, **kwargs):  # every interpreted launch, kernel[grid](...) or autotuned
        count[0] += 1
        return original(self, *args, **kwargs)

    executor.__call__ = launch
    try:
        yield count
    finally:
        executor.__call__ = original


def interpreted_kernels_reason(call):
    """Why ``call`` (one run of the op) cannot be timed here, or None.

    Only under the interpreter, with triton's interpreter imported, is
    ``call`` run: once, counting interpreted launches. Whatever it raises is left to the timing
    itself to report.
    """
    if not interpreter_on() or sys.modules.get("triton.runtime.interpreter") is None:
        return None  # no kernel can have run interpreted
    with counting_interpreted_launches() as count:
        try:
            call()
        except Exception:  # noqa: BLE001 - the bench run reports the op's own errors
            pass
    if count is None or count[0]:
        return BENCH_REFUSAL
    return None


def interpreter_refusal(error):
    """Why no check can judge an op that raised ``error`` here, or None.

    Triton's interpreter wraps anything a kernel body raises in
    ``InterpreterError``; most of what real kernel libraries trip over is a
    limit of the interpreter (a scalar argument used as a tensor, a ``None``
    pointer argument), not a bug of a kernel that runs on GPUs every day. So
    under ``TRITON_INTERPRET=1`` such an op is skipped with the interpreter's
    words, never failed; on a GPU the compiled kernel is judged.
    """
    if not interpreter_on():
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        kind = type(error)
        if kind.__name__ == "InterpreterError" and kind.__module__.startswith("triton"):
            first = str(error).strip().splitlines()[0] if str(error).strip() else kind.__name__
            return (f"Triton's interpreter cannot run this op's kernel ({first[:200]}): a limit of {ENV}=1, not a "
                    "verdict on the kernel; run the checks on a GPU without it")
        error = error.__cause__ or error.__context__
    return None


BF16_REFUSAL = (f"{ENV}=1: Triton's interpreter computes bfloat16 arithmetic wrongly (x * x on bfloat16 values gives "
                "numbers near 1e33; loads, stores and float32 arithmetic are exact), so a bfloat16 mismatch of an op "
                "that launches Triton kernels says nothing about the kernel; judge bfloat16 on a GPU")


@contextmanager
def watching_bfloat16_kernels():
    """Yields a callable ``blame(dtype_label)``: BF16_REFUSAL when a bfloat16 verdict on the code run in the
    block cannot be trusted (the interpreter is on and interpreted kernels ran), else None."""
    if not interpreter_on() or sys.modules.get("triton.runtime.interpreter") is None:
        yield lambda dtype: None
        return
    with counting_interpreted_launches() as count:
        yield lambda dtype: BF16_REFUSAL if dtype == "bfloat16" and (count is None or count[0]) else None

