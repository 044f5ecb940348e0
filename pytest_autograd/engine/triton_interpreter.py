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


_SELF_TEST = {}  # dtype label -> None (computes right) or what went wrong; measured once per process


def _square_plus_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def square_plus(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(y_ptr + offsets, x * x + x, mask=mask)

    return square_plus


def interpreter_arithmetic_problem(dtype_label):
    """What Triton's interpreter gets wrong computing in ``dtype_label``, or None when it computes right.

    Measured, not looked up by version: a tiny kernel (x * x + x) runs once per dtype and process in the
    interpreter and is compared with torch; more than a few units of the dtype's last place is wrong.
    (triton 3.9 computes bfloat16 arithmetic wrongly while float16, float32 and float64 are right.)
    """
    if dtype_label not in _SELF_TEST:
        _SELF_TEST[dtype_label] = _measure(dtype_label)
    return _SELF_TEST[dtype_label]


def _measure(dtype_label):
    import torch

    dtype = getattr(torch, dtype_label, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return None
    try:
        x = torch.linspace(-3, 3, 64, dtype=torch.float64).to(dtype)
        y = torch.empty_like(x)
        _square_plus_kernel()[(1,)](x, y, x.numel(), BLOCK=64)
    except Exception as error:  # noqa: BLE001 - an interpreter that cannot even run it computes nothing right
        return f"its self-test kernel raised {type(error).__name__}"
    expected = (x.double() * x.double() + x.double()).to(dtype).double()
    error = (y.double() - expected).abs().max().item()
    if error <= 4 * torch.finfo(dtype).eps * expected.abs().max().item():
        return None
    return f"x * x + x off by {error:.3g} on values of magnitude 3"


_WATCHES = []  # the _Watch of each watching_interpreted_dtypes block under way, innermost last


class _Watch:
    """What a block under the interpreter can tell about a dtype: ``why(dtype)`` its numbers cannot be trusted;
    called, the same with how to judge them."""

    def __init__(self, count):
        self.count = count  # interpreted launches so far (None: unknowable, assume some)

    def why(self, dtype):
        if not dtype or not (self.count is None or self.count[0]):
            return None
        problem = interpreter_arithmetic_problem(dtype)
        if problem is None:
            return None
        return (f"{ENV}=1: Triton's interpreter computes {dtype} arithmetic wrongly here (its self-test: {problem}), "
                f"so a {dtype} mismatch of an op that launches Triton kernels says nothing about the kernel")

    def __call__(self, dtype):
        why = self.why(dtype)
        return f"{why}; {judge_on_a_gpu(dtype)}" if why else None


@contextmanager
def watching_interpreted_dtypes():
    """Yields ``refusal(dtype_label)``: why a verdict in that dtype on the code run in the block cannot be trusted
    (interpreted kernels ran, and the interpreter computes that dtype wrongly), and how to judge it; else None.
    ``refusal.why(dtype_label)`` says why alone. Code run in the block may ask through :func:`untrusted_dtype`."""
    if not interpreter_on() or sys.modules.get("triton.runtime.interpreter") is None:
        yield _Watch([0])  # no kernel can run interpreted
        return
    with counting_interpreted_launches() as count:
        watch = _Watch(count)
        _WATCHES.append(watch)
        try:
            yield watch
        finally:
            _WATCHES.pop()


def untrusted_dtype(dtype):
    """Why numbers computed in ``dtype`` (a torch dtype or its label) so far in the check under way cannot be
    trusted: the op launched interpreted kernels and Triton's interpreter computes that dtype wrongly. None when
    they can be (no interpreter, no kernel launched, a dtype it computes right, no check under way)."""
    if not _WATCHES or dtype is None:
        return None
    return _WATCHES[-1].why(str(dtype).replace("torch.", ""))


def judge_on_a_gpu(dtype):
    """How to judge ``dtype`` where the interpreter cannot."""
    return f"judge {dtype} on a GPU"


# What torch says when FakeTensor tracing (opcheck's fake tensor and aot dispatch tests, torch.compile) reaches
# a kernel that runs on real memory: under the interpreter a triton_op's wrap_triton launch is such a kernel.
_FAKE_TRACING_INTO_KERNEL = (
    "Cannot access data pointer of Tensor",
    "Attempted to access the data pointer on an invalid python storage",
    'Attempted to set the storage of a tensor on device "meta" to a storage on different device',
)


def fake_tracing_refusal(error_text):
    """Why a failure of FakeTensor tracing says nothing about the op here, or None (see _FAKE_TRACING_INTO_KERNEL)."""
    if not interpreter_on() or not any(marker in str(error_text) for marker in _FAKE_TRACING_INTO_KERNEL):
        return None
    return (f"{ENV}=1: Triton's interpreter runs kernels on real memory, so tracing with fake tensors (opcheck's "
            "fake tensor and aot dispatch tests, torch.compile) reaches into the interpreted kernel; a limit of the "
            "interpreter, not of the op: run these on a GPU without it")

