"""The custom ops a capture saw, grouped: one entry per op, its calls grouped by signature.

A signature is what changes an op's behaviour between calls: each tensor
argument's shape, dtype and device, and every other argument's value. An op
called once per layer has one signature however many layers call it; each
signature keeps one call's arguments, the one where the most arguments
required grad (so the gradient of an input the first layer receives as plain
data is still checked when a later layer differentiates it).

Also: telling which scanned ops ``ops=`` / ``skip_ops=`` name.
"""

from dataclasses import dataclass, field

import torch

from pytest_autograd.engine.case import argument_names
from pytest_autograd.engine.model_capture import short_value
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.compare import dtype_label
from pytest_autograd.results.naming import display_name


@dataclass(eq=False)
class Signature:
    """One (shapes, dtypes, other arguments) of an op, the number of calls with it, and one call's arguments."""

    key: tuple
    call: object  # the CapturedCall whose arguments are checked
    calls: int = 1

    def constant_slots(self):
        """Floating tensor arguments that did not require grad at the call: checked as constants."""
        slots = []
        for slot, value in _slots(self.call):
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()) \
                    and slot not in self.call.grad_slots:
                slots.append(slot)
        return slots

    def describe(self, names):
        """``x[2, 8, 16] float32, weight[16] float32 constant, eps=1e-06``."""
        parts = []
        for slot, value in _slots(self.call):
            name = slot if isinstance(slot, str) else (names[slot] if slot < len(names) else f"arg{slot}")
            if isinstance(value, torch.Tensor):
                constant = " constant" if ((value.is_floating_point() or value.is_complex())
                                           and slot not in self.call.grad_slots) else ""
                device = "" if value.device.type == "cpu" else f" {value.device}"
                parts.append(f"{name}{list(value.shape)} {dtype_label(value.dtype)}{device}{constant}")
            else:
                parts.append(f"{name}={short_value(value)}")
        return ", ".join(parts)


@dataclass(eq=False)
class ScannedOp:
    """A custom op the model ran: where from, how often, with which signatures."""

    key: str
    op: object
    name: str
    signatures: list = field(default_factory=list)
    sites: list = field(default_factory=list)
    modules: list = field(default_factory=list)
    calls: int = 0

    @property
    def arg_names(self):
        names = self.__dict__.get("_arg_names")
        if names is None:
            names = self.__dict__["_arg_names"] = argument_names(self.op)
        return names

    @property
    def site(self):
        return self.sites[0] if self.sites else "<unknown>"

    def where(self):
        """``at model.py:40 (and 1 other site), in blocks.0.norm``."""
        text = f"at {self.site}"
        if len(self.sites) > 1:
            others = len(self.sites) - 1
            text += f" (and {others} other site{'s' if others > 1 else ''})"
        if self.modules:
            text += f", in {self.modules[0]}"
        return text

    def seen(self):
        """``3 calls, 2 signatures``."""
        plural = "s" if len(self.signatures) != 1 else ""
        return f"{self.calls} call{'s' if self.calls != 1 else ''}, {len(self.signatures)} signature{plural}"


def group_calls(calls):
    """The scanned ops, in the order they were first called, their calls grouped by signature."""
    ops = {}
    for call in calls:
        scanned = ops.get(call.key)
        if scanned is None:
            scanned = ops[call.key] = ScannedOp(call.key, call.op, display_name(call.op))
        scanned.calls += 1
        if call.site not in scanned.sites:
            scanned.sites.append(call.site)
        if call.module and call.module not in scanned.modules:
            scanned.modules.append(call.module)
        found = next((s for s in scanned.signatures if s.key == call.signature), None)
        if found is None:
            scanned.signatures.append(Signature(call.signature, call))
            continue
        found.calls += 1
        if call.kept and len(call.grad_slots) > len(found.call.grad_slots):
            found.call = call
    _disambiguate([op for op in ops.values()])
    return list(ops.values())


def _disambiguate(ops):
    """Two ops with the same short name (two ``RMSNorm`` Functions in two modules) get their full names."""
    names = {}
    for op in ops:
        names.setdefault(op.name, []).append(op)
    for same in names.values():
        if len(same) > 1:
            for op in same:
                op.name = op.key


def _slots(call):
    return list(enumerate(call.args)) + list(call.kwargs.items())


# ---------------------------------------------------------------------------
# ops= and skip_ops=
# ---------------------------------------------------------------------------


def op_aliases(scanned):
    """Every name ``ops=`` may use for an op: its display name, full name, and torch.ops spellings."""
    op = scanned.op
    names = {scanned.name, scanned.key, display_name(op)}
    if isinstance(op, type):
        names.update({op.__name__, op.__qualname__})
    else:
        base = scanned.key.split(".", 1)[0]  # ns::name without the overload
        namespace, _, name = base.partition("::")
        names.update({base, f"{namespace}.{name}", f"torch.ops.{namespace}.{name}", name})
    return names


def matches(entry, scanned):
    """Whether ``entry`` of ``ops=``/``skip_ops=`` (a name, a Function class, an operator) names ``scanned``."""
    if isinstance(entry, str):
        return entry in op_aliases(scanned)
    if isinstance(entry, type):
        return scanned.op is entry
    key = entry_key(entry)
    if key is None:
        return False
    return scanned.key == key or scanned.key.startswith(key + ".")


def entry_key(entry):
    """The operator key of an operator given as an object (a packet, an overload, a custom_op)."""
    from pytest_autograd.engine.model_capture import operator_key

    inner = getattr(entry, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    return operator_key(inner if inner is not None else entry)


def select_ops(scanned, ops=None, skip_ops=None):
    """(the ops to check, notes): ``ops=`` keeps the ops it names, ``skip_ops=`` drops them.

    An ``ops=`` entry that names no op that ran is a mistake (the op it means
    would go unchecked); a ``skip_ops=`` entry that names none is noted.
    """
    notes = []
    chosen = list(scanned)
    if ops is not None:
        entries = _entries(ops)
        missing = [entry for entry in entries if not any(matches(entry, op) for op in scanned)]
        if missing:
            raise UsageProblem(
                f"ops= names {', '.join(_entry_text(e) for e in missing)}, which did not run in the model's forward; "
                f"the custom ops that ran are: {ran_list(scanned)}. Name them by these names or pass the "
                "Function class or torch.ops operator itself.")
        chosen = [op for op in chosen if any(matches(entry, op) for entry in entries)]
    if skip_ops is not None:
        entries = _entries(skip_ops)
        for entry in entries:
            if not any(matches(entry, op) for op in scanned):
                notes.append(f"skip_ops= names {_entry_text(entry)}, which did not run; the custom ops that ran "
                             f"are: {ran_list(scanned)}")
        chosen = [op for op in chosen if not any(matches(entry, op) for entry in entries)]
    return chosen, notes


def ran_list(scanned):
    return ", ".join(f"`{op.name}`" for op in scanned) or "none"


def _entries(value):
    return list(value) if isinstance(value, (list, tuple, set, frozenset)) else [value]


def _entry_text(entry):
    return repr(entry) if isinstance(entry, str) else f"`{display_name(entry)}`"
