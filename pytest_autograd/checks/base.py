"""The unit every check is: a name, an ``applies`` predicate and a ``run``.

A third-party check subclasses :class:`Check` and registers an instance
through the ``pytest_autograd_register_checks`` hook, exactly like the
built-in ones.
"""

import torch

from pytest_autograd.checks._agreement import agree
from pytest_autograd.engine.execution import OpRaised, floating_dtype, prepare, run_op
from pytest_autograd.engine.seeding import item_seed
from pytest_autograd.results.compare import (
    Mismatch,
    compare_tensors,
    dtype_label,
    tolerance_for,
)
from pytest_autograd.results.evidence import Evidence
from pytest_autograd.results.report import CheckFailure, Report


class Check:
    """Base class of checks.

    ``default``: False for opt-in checks, whose items are skipped unless
    selected (``--autograd-checks`` or ``checks=`` on the marker).
    ``options``: extra marker keywords this check understands, with defaults.
    ``times_the_op``: True for a check that times the op, which runs it as the project does. Every other check
    runs with torch's TF32 switches off (``engine.float32_math``), so a float32 verdict judges the op's code, not
    the GPU's default math mode, and with large tensors reusing freed memory (``engine.freed_memory``).
    ``random_draws_differ``: for a check comparing runs that cannot draw the same random numbers, what differs
    between them; a failure on an op drawing from torch's global generator is then judged again with its draws
    fixed by position (``engine.random_draws``).
    ``explores``: True for a check that runs the op on inputs the user did not give (other sizes, layouts,
    magnitudes): it runs whole in the sandbox process, where a crash of the op is a verdict
    (``engine.exploration``).
    """

    name = None
    description = ""
    default = True
    options = {}
    times_the_op = False
    random_draws_differ = None
    explores = False

    def applies(self, case, device):
        """Return None when the check applies, else the reason it is skipped."""
        return None

    def run(self, context):
        """Raise :class:`CheckFailure` (via ``context.fail``) when the op is wrong."""
        raise NotImplementedError


class CheckContext:
    """What a check run gets: the case, the device, a seeded generator, helpers."""

    def __init__(self, check_name, case, device, seed):
        self.check_name = check_name
        self.case = case
        self.device = device
        self.seed = seed
        self.generator = torch.Generator().manual_seed(check_stream_seed(seed))
        self.sample_index = None
        self.dtype = None
        self.notes = []  # what a user should know that is not a failure (shown on passing items)
        self.rows_judged = {}  # sample index -> the FewerRows judged instead (``_fewer_rows``; a failure names it)

    def restart(self):
        """Ready to run the check again from its start: its generator back at the start of its stream, no
        sample or dtype under way; the notes so far are kept."""
        self.generator = torch.Generator().manual_seed(check_stream_seed(self.seed))
        self.sample_index = None
        self.dtype = None

    def shared_work_seed(self, what, index):
        """The seed of ``what`` one check computes for others on sample ``index`` (a FirstOrder, a plain run): from
        the run's shared seed, not the check's, so a check judges the same whether it found the work done or did it."""
        base = self.case.shared_seed
        return item_seed(self.seed if base is None else base, f"{what}:{self.device}:{index}")

    def samples(self):
        """(index, sample) pairs; failures raised meanwhile name the sample."""
        from pytest_autograd.engine.exploration.variants import mark_sample

        for index, sample in enumerate(self.case.samples):
            self.sample_index = index
            mark_sample(index)
            yield index, sample
        self.sample_index = None

    def note(self, text):
        """Record something the user should see that is not a failure: never failed; shown once, as a warning
        at the test's line, and kept in the item's report section and JSON record."""
        where = f"sample {self.sample_index}: " if self.sample_index is not None else ""
        text = where + text
        if text not in self.notes:
            self.notes.append(text)
            from pytest_autograd.engine.notes import note

            note(text)

    def prepare(self, sample, device=None, dtype=None, **kwargs):
        self.dtype = dtype or floating_dtype(sample)
        return prepare(self.case, sample, device or self.device, dtype=dtype, **kwargs)

    def run_op(self, prepared, leaves=None, fn=None, clone_leaves=True):
        return run_op(self.case, prepared, leaves, fn, clone_leaves)

    def tolerance(self, dtype):
        return tolerance_for(dtype, self.case.option("atol"), self.case.option("rtol"))

    def failure(self, summary, **fields):
        fields.setdefault("device", self.device)
        fields.setdefault("sample", self.sample_index)
        if "dtype" not in fields and self.dtype is not None:
            fields["dtype"] = dtype_label(self.dtype)
        return CheckFailure(Report(check=self.check_name, summary=summary, seed=self.seed, **fields))

    def fail(self, summary, **fields):
        raise self.failure(summary, **fields)

    def fail_reference_raised(self, raised):
        """Fail because ``reference=`` raised (an OpRaised from calling it): blame the reference, not the op."""
        from pytest_autograd.engine.case import op_display_name

        skip_if_the_interpreter_refused(raised)
        where = raised.where()
        self.fail(f"reference={op_display_name(self.case.reference)} raised {type(raised.error).__name__} in its "
                  f"{raised.phase}: {raised.error}", details=[f"at {where}"] if where else [],
                  hint="the reference must take the same arguments as the op and run on every sample it runs on")

    def fail_raised(self, raised, situation="", hint=None, details=(), **fields):
        """Fail because the op raised (an OpRaised): its error, what was tried, and the user's frame."""
        skip_if_the_interpreter_refused(raised)
        where = raised.where()
        details = list(details) + ([f"at {where}"] if where else [])
        during = f" {situation}" if situation else ""
        self.fail(f"the op's {raised.phase} raised {type(raised.error).__name__}{during}: {raised.error}",
                  details=details, hint=hint, **fields)

    def compare(self, expected, got, summary, what, dtype=None, hint=None, **fields):
        """Compare two tensors with dtype-aware tolerances; fail naming ``what``."""
        atol, rtol = self.tolerance(dtype or expected.dtype)
        if agree(expected, got, atol, rtol):
            return
        mismatch = compare_tensors(expected, got, atol, rtol)
        if mismatch is None:
            return
        evidence = [Evidence.of(what, expected, got, mismatch.index)] if mismatch.problem is None else []
        self.fail_mismatch(mismatch, summary, what, hint=hint, evidence=evidence, **fields)

    def fail_mismatch(self, mismatch: Mismatch, summary, what, hint=None, **fields):
        self.fail(summary, worst=mismatch.worst(what), error=mismatch.error_line(), hint=hint, **fields)


def skip_if_the_interpreter_refused(raised):
    """An op whose Triton kernel Triton's interpreter cannot run is skipped, not failed (see triton_interpreter)."""
    from pytest_autograd.engine.outcomes import skip
    from pytest_autograd.engine.triton_interpreter import interpreter_refusal

    refusal = interpreter_refusal(raised.error)
    if refusal:
        skip(refusal)


def check_stream_seed(seed):
    """The seed of a check's own generator: derived from the item's seed, never equal to it.

    The test body draws its samples from the global RNG seeded with the
    item's seed; a generator seeded the same would replay that stream, so
    the first random cotangent would equal the first sample tensor, which
    hides bugs (``x.T @ x`` is symmetric, so a transposed weight gradient
    passes; ReLU's cotangent is negative only where its gradient is zero).
    """
    return (seed * 0x9E3779B1 + 0x7F4A7C15) % (2**63 - 1)


__all__ = ["Check", "CheckContext", "CheckFailure", "OpRaised"]
