"""What a check is running the op on right now: the user's own sample, or a variant it built.

A check names each input it builds (``exploring(context, Variant(...))``);
every call of the op inside that block is a call on that variant, and is
tried in the sandbox first (``isolation``). Outside any such block, a check
runs the op on the user's own sample (in the dtypes and copies the check
makes of it), which is tried the same way. The innermost block is the one a
crash is blamed on. Imports no torch: ``OpCase.call`` asks on every call.
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """An input a check runs the op on.

    ``situation`` completes "crashed the process ..." ("when `grad_output` is row-strided", "when dim 0 of `x`
    (size 8 in your sample) is 1"). ``evidence``: what shows the op must accept it, so that a crash there is
    the op's fault (the user's own values in another valid layout, a size ``sizes=`` declares), as
    ``verdicts`` weighs a mismatch; empty when the plugin made it up, and then ``missing`` says why nothing
    does and ``how`` what would make it a check (a crash there is noted, not judged).
    ``cotangent_layout``: a module-level function laying out each incoming gradient as the check will (None
    where it is not laid out: a trial run uses contiguous ones). ``order``: 2 where the check differentiates
    the gradients again.
    """

    check: str
    situation: str
    evidence: tuple = ()
    missing: str = None
    how: str = None
    cotangent_layout: object = None
    order: int = 1
    hint: str = None  # what usually makes an op crash on such an input, for the failure's hint
    narrows: bool = False  # a crash there is narrowed down (the block's ``narrow`` tries its parts one by one)
    tried: bool = True  # each new kind of call tried in the sandbox first, where the check runs in this process

    def key(self):
        return (self.check, self.situation, self.order)


class VariantCrashed(BaseException):
    """Raised from the op's call when its trial run crashed: the check's own ``except Exception`` clauses never
    take it for the op raising; the block that named the variant turns it into a verdict."""

    def __init__(self, variant, trial):
        super().__init__(variant.situation)
        self.variant, self.trial = variant, trial


_ACTIVE = []  # (context, Variant), innermost last


def active():
    """The innermost (context, Variant) being explored, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextmanager
def naming(context, variant):
    """Calls of the op inside the block are calls on ``variant`` (no verdict handling: see ``exploring``). In a
    sandbox running a whole check, the block is marked in the log (a crash is blamed on the innermost open one),
    and a variant a previous run crashed on raises VariantCrashed at once instead of running again."""
    crashed = KNOWN_CRASHES.get(variant.key())
    if crashed is not None:
        raise VariantCrashed(variant, crashed)
    _ACTIVE.append((context, variant))
    depth = len(_ACTIVE)
    if MARKING:
        _mark(f"enter {depth} {json.dumps(dict(_fields(variant), sample=context.sample_index))}")
    try:
        yield
    finally:
        del _ACTIVE[depth - 1:]
        if MARKING:
            _mark(f"exit {depth}")


MARK = "pytest-autograd variant: "
MARKING = False  # True in a sandbox process running whole checks
KNOWN_CRASHES = {}  # in such a sandbox: Variant.key() -> the Trial of the crash an earlier run met there


def _fields(variant):
    return {"check": variant.check, "situation": variant.situation, "evidence": list(variant.evidence),
            "missing": variant.missing, "how": variant.how, "order": variant.order, "hint": variant.hint,
            "narrows": variant.narrows}


def mark_sample(index):
    """In a sandbox running whole checks: the check goes on to sample ``index`` (a crash in a variant entered
    before, such as the check's calls on the user's own samples, names it)."""
    if MARKING:
        _mark(f"sample {index}")


def _mark(text):
    import os

    os.write(2, f"\n{MARK}{text}\n".encode())


def innermost_open(log):
    """(the innermost Variant a sandbox's log shows entered and not left, the sample it was on), or (None,
    None). Its cotangent layout is not kept: a variant's key leaves it out."""
    stack = []
    for line in log.splitlines():
        if not line.startswith(MARK):
            continue
        words = line[len(MARK):].split(" ", 2)
        if words[0] == "enter" and len(words) == 3:
            del stack[int(words[1]) - 1:]
            fields = json.loads(words[2])
            sample = fields.pop("sample", None)
            fields["evidence"] = tuple(fields.get("evidence", ()))
            stack.append([Variant(**fields), sample, sample is None])  # None: entered before the samples
        elif words[0] == "exit" and len(words) >= 2:
            del stack[int(words[1]) - 1:]
        elif words[0] == "sample" and len(words) == 2:
            for entry in stack:
                if entry[2]:  # the variant spans the check's loop over the samples: it is on this one now
                    entry[1] = int(words[1])
    return tuple(stack[-1][:2]) if stack else (None, None)
