"""Checking the custom ops inside a model, on the arguments the model really gave them.

    from pytest_autograd import autograd_scan

    result = autograd_scan(model, x)          # forward + backward once, then the battery on each custom op
    print(result)                             # "3 ops checked, 1 wrong: `FusedSwiGLU` at model.py:88 ..."
    for verdict in result.wrong:
        print(verdict.render())

The capture (:mod:`model_capture`) records every top-level custom
``autograd.Function`` and ``torch.ops`` call; :mod:`model_ops` groups the
calls by signature; here each op is checked on a few of its signatures with
:func:`~pytest_autograd.engine.api.run_checks`, each tensor argument that did
not require grad at the call passed as a constant, and its sizes judged at
the arguments it gets when the model runs at other input sizes
(:mod:`model_sizes`).
"""

from dataclasses import dataclass, field

from pytest_autograd.engine import notes
from pytest_autograd.engine.api import Outcome, run_checks
from pytest_autograd.engine.builtin import register_builtin_checks
from pytest_autograd.engine.case import Sample
from pytest_autograd.engine.devices import devices_option
from pytest_autograd.engine.model_capture import capture_model
from pytest_autograd.engine.model_options import (
    DEFAULT_MAX_SIGNATURES,
    autocast_check_options,
    op_options_known,
    validate_scan_options,
)
from pytest_autograd.engine.model_ops import group_calls, ran_list, select_ops
from pytest_autograd.engine.model_sizes import judges_sizes, model_sizes
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.registry import CheckRegistry
from pytest_autograd.engine.seeding import item_seed

NOTHING_RAN = "no custom autograd Function or custom op ran: nothing to check"


class NothingToCheck(Exception):
    """The model ran no custom op (or ``ops=``/``skip_ops=`` left none): a skip, never a pass."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------
# What the test body returns
# ---------------------------------------------------------------------------


def model_and_calls(returned, where="autograd_model"):
    """``(model, args)`` from a test body (or ``autograd_scan``'s arguments) as (model, [Sample])."""
    import torch

    shape = ("`return model, (x,)`: the model (an nn.Module or any callable) and one call's positional "
             "arguments as a tuple, or a list of such tuples for several calls")
    if returned is None:
        raise UsageProblem(f"{where}: the test body returned None; a test marked autograd_model must {shape}.")
    if callable(returned) and not isinstance(returned, tuple):
        raise UsageProblem(f"{where}: the test body returned the model alone ({type(returned).__name__}); "
                           f"return its inputs too: {shape}.")
    if not isinstance(returned, tuple) or len(returned) != 2:
        got = f"a tuple of {len(returned)} values" if isinstance(returned, tuple) else type(returned).__name__
        raise UsageProblem(f"{where}: the test body returned {got}; return {shape}.")
    model, args = returned
    if not callable(model):
        raise UsageProblem(f"{where}: the model is a {type(model).__name__}, which cannot be called; give an "
                           f"nn.Module or a function on tensors: {shape}.")
    if isinstance(args, (tuple, Sample, torch.Tensor)):
        items = [args]
    elif isinstance(args, list) and args and all(isinstance(a, (tuple, Sample)) for a in args):
        items = args
    elif isinstance(args, list) and args and all(isinstance(a, torch.Tensor) for a in args):
        raise UsageProblem(f"{where}: the inputs are a list of {len(args)} tensors, which is ambiguous; give "
                           "a tuple for one call's arguments, `return model, (x, mask)`, or a list of tuples "
                           "for several calls, `return model, [(x1,), (x2,)]`.")
    else:
        raise UsageProblem(f"{where}: the model's inputs are {_kind(args)}; {shape}.")
    return model, [_call(item, index, where) for index, item in enumerate(items)]


def _call(item, index, where):
    import torch
    from torch.utils import _pytree as pytree

    sample = item if isinstance(item, Sample) else Sample(item) if isinstance(item, torch.Tensor) else Sample(*item)
    leaves = pytree.tree_leaves((sample.args, sample.kwargs))
    label = f"call {index}" if index else "the call"
    for value in leaves:
        if type(value).__module__ == "numpy" and hasattr(value, "shape"):
            raise UsageProblem(f"{where}: {label}'s inputs hold a numpy array; pass torch tensors "
                               "(torch.from_numpy(array)).")
    if not any(isinstance(value, torch.Tensor) for value in leaves):
        raise UsageProblem(f"{where}: {label}'s inputs ({sample!r}) hold no tensor; the model must be called "
                           "on tensors, e.g. `return model, (torch.randn(2, 8, 16),)`.")
    return sample


def _kind(value):
    if isinstance(value, list):
        return "an empty list" if not value else f"a list of {', '.join(sorted({type(v).__name__ for v in value}))}"
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------


@dataclass(eq=False)
class Checked:
    """One signature of an op and the outcomes of the checks run on it."""

    signature: object
    text: str
    outcomes: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # what the checks noted (a low-precision strategy, kinks)


@dataclass(eq=False)
class OpVerdict:
    """An op the model ran, and what the checks said about it on the signatures checked."""

    scanned: object  # model_ops.ScannedOp
    checked: list = field(default_factory=list)  # [Checked]
    problem: str = None  # why it could not be checked at all

    @property
    def name(self):
        return self.scanned.name

    @property
    def op(self):
        return self.scanned.op

    @property
    def outcomes(self):
        return [o for c in self.checked for o in c.outcomes]

    @property
    def status(self):
        statuses = {o.status for o in self.outcomes}
        if "failed" in statuses:
            return "failed"
        return "passed" if "passed" in statuses else "skipped"

    def headline(self):
        """```LinearFunction` at model.py:40, in blocks.0.attn: 4 calls, 1 signature, 1 checked``."""
        unchecked = len(self.scanned.signatures) - len(self.checked)
        checked = f"{len(self.checked)} checked" + (f", {unchecked} not (max_signatures=)" if unchecked else "")
        return f"`{self.name}` {self.scanned.where()}: {self.scanned.seen()}, {checked}"

    def skip_reason(self):
        """Why no check judged the op (each distinct reason once)."""
        reasons = [self.problem] if self.problem else [o.detail for o in self.outcomes if o.status == "skipped"]
        return "; ".join(dict.fromkeys(reasons)) or "not checked"

    def line(self):
        """The headline and the verdict; a skipped op's reasons."""
        if self.status != "skipped":
            return f"{self.headline()}: {self.status}"
        return f"{self.headline()}: skipped ({self.skip_reason()})"

    def render(self, indent="  "):
        """The op, each signature checked and what each check said; failures with their full report."""
        lines = [f"{self.headline()}: {self.status}"]
        if self.problem:
            lines.append(f"{indent}not checked: {self.problem}")
        for checked in self.checked:
            lines.append(f"{indent}checked at {checked.text}")
            lines.extend(outcome_lines(checked.outcomes, indent * 2))
            lines.extend(f"{indent * 2}note: {note}" for note in checked.notes)
        return "\n".join(lines)


def outcome_lines(outcomes, indent):
    """Failures in full, then the passed checks on one line (notes below), the skipped ones by reason."""
    lines = []
    for outcome in outcomes:
        if outcome.status == "failed":
            report = outcome.detail.splitlines() or [""]
            lines.append(f"{indent}{outcome.check}-{outcome.device} failed: {report[0]}")
            lines.extend(indent + line for line in report[1:])
    passed = [o for o in outcomes if o.status == "passed"]
    if passed:
        lines.append(f"{indent}passed: {', '.join(f'{o.check}-{o.device}' for o in passed)}")
        lines.extend(f"{indent}note ({o.check}-{o.device}): {o.detail}" for o in passed if o.detail)
    reasons = {}
    for outcome in outcomes:
        if outcome.status == "skipped":
            reasons.setdefault(outcome.detail, []).append(f"{outcome.check}-{outcome.device}")
    lines.extend(f"{indent}skipped: {', '.join(names)} ({reason})" for reason, names in reasons.items())
    return lines


@dataclass(eq=False)
class ScanResult:
    """Every custom op the model ran and its verdict; ``wrong`` are those a check failed."""

    verdicts: list
    backward: str = "ran"
    notes: list = field(default_factory=list)

    @property
    def wrong(self):
        return [v for v in self.verdicts if v.status == "failed"]

    @property
    def passed(self):
        return [v for v in self.verdicts if v.status == "passed"]

    @property
    def skipped(self):
        return [v for v in self.verdicts if v.status == "skipped"]

    def summary(self):
        """``3 ops checked, 1 wrong: `FusedSwiGLU` at model.py:88 (gradcheck)``."""
        checked = len(self.verdicts) - len(self.skipped)
        text = f"{checked} op{'s' if checked != 1 else ''} checked"
        if self.skipped:
            text += f" ({len(self.skipped)} more skipped)"
        if not self.wrong:
            return text + ", none wrong"
        wrong = "; ".join(f"`{v.name}` at {v.scanned.site} ({', '.join(_failed_checks(v))})" for v in self.wrong)
        return f"{text}, {len(self.wrong)} wrong: {wrong}"

    def render(self, brief=False):
        """The summary, then every op: the wrong ones with their reports. ``brief``: the others in one line each."""
        lines = [self.summary(), ""] + [v.render() for v in self.wrong]
        others = self.passed + self.skipped
        if brief:
            lines += [v.line() for v in others]
        else:
            lines += [v.render() for v in others]
        lines += self._footer()
        return "\n".join(lines)

    def all_notes(self):
        """The scan's own notes: a backward that raised, ``skip_ops=`` entries that named no op."""
        raised = []
        if self.backward not in ("ran", "none"):
            raised.append(f"the model's backward raised {self.backward}; each op's own backward is judged on its own")
        return raised + list(self.notes)

    def _footer(self):
        lines = [f"note: {note}" for note in self.all_notes()]
        return [""] + lines if lines else []

    def __str__(self):
        return self.render()


def _failed_checks(verdict):
    return list(dict.fromkeys(f"{o.check}" for o in verdict.outcomes if o.status == "failed"))


# ---------------------------------------------------------------------------
# Scanning
# ---------------------------------------------------------------------------


def scan_ops(capture, ops=None, skip_ops=None):
    """(the scanned ops to check, notes) from a capture; NothingToCheck when none is left."""
    scanned = group_calls(capture.calls)
    if not scanned:
        raise NothingToCheck(NOTHING_RAN + " (Functions defined in torch itself and aten/prims operators are not "
                             "custom ops; a forward under torch.compile is not captured)")
    chosen, notes = select_ops(scanned, ops, skip_ops)
    if not chosen:
        raise NothingToCheck(f"skip_ops= leaves no op to check; the custom ops that ran are: {ran_list(scanned)}")
    return chosen, notes


def check_ops(scanned_ops, checks, devices=None, seed=0, registry=None, run_options=None, max_signatures=None,
              op_options=None, explicit=True, at_other_sizes=None, **options):
    """One OpVerdict per scanned op: ``checks`` on its first ``max_signatures`` signatures.

    ``devices``: where to check (None: the device each op's call ran on).
    ``explicit``: False skips opt-in checks, as a marker without checks= does.
    ``at_other_sizes``: the model's runs at other input sizes (``model_sizes.ModelSizes``): each signature's sizes are
    judged at the arguments it gets there (``size_samples=``), unless ``sizes=`` or ``size_samples=`` is given.
    """
    if max_signatures is None:
        max_signatures = 10**9
    verdicts = []
    for scanned in scanned_ops:
        verdict = OpVerdict(scanned)
        per_op = _per_op_options(scanned, op_options)
        for index, signature in enumerate(scanned.signatures[:max_signatures]):
            checked = Checked(signature, signature.describe(scanned.arg_names))
            verdict.checked.append(checked)
            here = devices or [_device_of(signature.call)]
            first_note = notes.count()
            try:
                judged_at = {**options, **per_op}
                if at_other_sizes is not None and judged_at.get("sizes") is None \
                        and judged_at.get("size_samples") is None:
                    judged_at["size_samples"] = at_other_sizes.samples_for(scanned, signature)
                checked.outcomes = _run(scanned, signature, checks, here, item_seed(seed, f"{scanned.key}:{index}"),
                                        registry, run_options, explicit, judged_at)
            except UsageProblem as problem:  # the captured arguments cannot be checked as they are
                checked.outcomes = [Outcome(name, device, "skipped", f"not checked: {problem}")
                                    for name in checks for device in here]
            checked.notes = [n for n in notes.since(first_note)
                             if not any(n in o.detail for o in checked.outcomes if o.status == "passed")]
        verdicts.append(verdict)
    return verdicts


def _run(scanned, signature, checks, devices, seed, registry, run_options, explicit, options):
    """The outcomes of ``checks`` on one signature of one op, in ``checks``' order."""
    call = signature.call
    sample = Sample(*call.args, **call.kwargs)
    names = checks if explicit else [n for n in checks if getattr(registry.get(n), "default", True)]
    options, no_second = _options_for(scanned, signature, sample, names, seed, options)
    captured = _device_of(call)
    elsewhere = [d for d in devices if captured.split(":")[0] not in ("cpu", d.split(":")[0])]
    devices = [d for d in devices if d not in elsewhere]
    outcomes = []
    if names and devices:
        outcomes = run_checks(scanned.op, checks=names, devices=devices, seed=seed, registry=registry,
                              samples=sample, run_options=run_options, **options)
    outcomes += [Outcome(n, d, "skipped", "opt-in check: name it in checks= to run it")
                 for n in checks if n not in names for d in devices]
    outcomes += [Outcome(n, d, "skipped", f"the model ran this op on {captured}, not on {d}: a kernel written for "
                                          f"one device may not run on another; build the model on the "
                                          f"`autograd_device` fixture's device to check it on each")
                 for n in checks for d in elsewhere]
    if no_second:
        outcomes = [Outcome(o.check, o.device, o.status, f"`{scanned.name}`: {no_second}; the model takes first "
                            "derivatives through it (double_backward=True in op_options= checks it anyway)")
                    if o.check == "gradgradcheck" and o.status == "skipped" else o for o in outcomes]
    order = {name: k for k, name in enumerate(checks)}
    return sorted(outcomes, key=lambda o: order.get(o.check, 0))


def _options_for(scanned, signature, sample, names, seed, options):
    """(the checks' options for this signature, why it has no second derivative or None).

    Arguments that did not require grad join ``constants=``; ``dtypes=`` and
    ``double_backward=`` come from the probes (model_probes) unless given.
    """
    options = dict(options)
    constants = list(signature.constant_slots())
    extra = options.pop("constants", None)
    if extra is not None:
        constants += [extra] if isinstance(extra, (str, int)) else list(extra)
    options["constants"] = constants or None
    differentiated = signature.call.grad_slots
    if options.get("dtypes") is None:
        options.update(_float32_kernel_options(scanned, sample, differentiated, seed))
    no_second = None
    if options.get("double_backward") is None and "gradgradcheck" in names:
        no_second = _backward_kernel_reason(scanned, sample, differentiated, seed)
        if no_second:
            options["double_backward"] = False
    return options, no_second


def _float32_kernel_options(scanned, sample, differentiated, seed):
    """``dtypes=`` for an op the model calls below float64 that computes in float32 (see model_probes); else {}."""
    import torch

    from pytest_autograd.engine.model_probes import first_floating_dtype, float32_compute_reason, judged_dtypes

    captured = first_floating_dtype(sample)
    if captured not in (torch.float32, torch.float16, torch.bfloat16):
        return {}
    reason = float32_compute_reason(scanned.op, sample, differentiated, seed)
    if reason is None:
        return {}
    label = str(captured).replace("torch.", "")
    notes.note(f"`{scanned.name}`: {reason} for float64 inputs, and the model calls it in {label}: judged in "
               "float32, the most precise dtype it computes in (give op_options={..: {'dtypes': ...}} to choose)")
    return {"dtypes": judged_dtypes(captured)}


def _backward_kernel_reason(scanned, sample, differentiated, seed):
    from pytest_autograd.engine.case import is_once_differentiable
    from pytest_autograd.engine.model_probes import backward_kernel_reason

    if isinstance(scanned.op, type) and is_once_differentiable(scanned.op):
        return None  # declared: gradgradcheck says so itself
    return backward_kernel_reason(scanned.op, sample, differentiated, seed)


def _per_op_options(scanned, op_options):
    from pytest_autograd.engine.model_ops import matches

    merged = {}
    for entry, per_op in (op_options or {}).items():
        if matches(entry, scanned):
            merged.update(per_op)
    return merged


def _device_of(call):
    import torch
    from torch.utils import _pytree as pytree

    for value in pytree.tree_leaves((call.args, call.kwargs)):
        if isinstance(value, torch.Tensor):
            return str(value.device)
    return "cpu"


def autograd_scan(model, *inputs, calls=None, checks=None, skip=None, devices=None, ops=None, skip_ops=None,
                  max_signatures=DEFAULT_MAX_SIGNATURES, op_options=None, seed=0, registry=None, run_options=None,
                  **options):
    """Run ``model(*inputs)`` (or each of ``calls``) and a backward, then check every custom op that ran.

    Returns a :class:`ScanResult` (its ``wrong``, ``passed`` and ``skipped``
    verdicts, ``render()`` for the full report); never raises for a wrong
    op. Raises :class:`UsageProblem` for a mistake in the call and for a
    model whose forward raises (with the model's own error and frame), and
    :class:`NothingToCheck` when no custom op ran.

    ``checks``/``skip``: check names (default: every default check).
    ``devices``: where to check (default: where each op ran). ``ops`` /
    ``skip_ops``: ops to keep / drop, by name or object. ``max_signatures``:
    signatures checked per op (None: all). ``op_options``: ``{op: {option:
    value}}`` for single ops (``reference=``, ``constants=``, ``atol=``...).
    ``autocast=torch.bfloat16`` (or float16): the model's forward runs under
    ``torch.autocast`` in that dtype, so each op is recorded with what a
    mixed-precision step hands it, and the autocast check judges it there.
    Other keywords are the checks' options for every op (``atol=``, ``dtypes=``...).
    """
    if registry is None:
        registry = CheckRegistry()
        register_builtin_checks(registry)
    names = select_checks(registry, checks, skip)
    known = op_options_known(registry, names)
    validate_scan_options({**options, "max_signatures": max_signatures, "op_options": op_options}, "autograd_scan",
                          known)
    if calls is not None and inputs:
        raise UsageProblem("autograd_scan: give the inputs of one call as arguments or several calls as calls=[...], "
                           "not both.")
    model, samples = model_and_calls((model, calls if calls is not None else tuple(inputs)), "autograd_scan")
    if devices is not None:
        devices = devices_option(devices, "autograd_scan: devices=")
    autocast = options.pop("autocast", None)
    plainly = [name for name in names if autocast is None or name != "autocast"]
    capture = capture_model(model, samples, seed=seed)
    scanned, notes = scan_ops(capture, ops, skip_ops)
    isolate = getattr(run_options, "isolate", "explore")
    sizes = model_sizes(model, samples, capture, seed, isolate) if judges_sizes(registry, plainly) else None
    verdicts = check_ops(scanned, plainly, devices=devices, seed=seed, registry=registry, run_options=run_options,
                         max_signatures=max_signatures, op_options=op_options, explicit=checks is not None,
                         at_other_sizes=sizes, **options)
    if len(plainly) < len(names):  # the autocast check on what the model's step under autocast hands each op
        under = scan_ops(capture_model(model, samples, seed=seed, autocast=autocast), ops, skip_ops)[0]
        verdicts = merged(verdicts, check_ops(
            under, ["autocast"], devices=devices, seed=seed, registry=registry, run_options=run_options,
            max_signatures=max_signatures, op_options=op_options, explicit=checks is not None,
            **autocast_check_options(options, autocast)))
    return ScanResult(verdicts, capture.backward, notes + (sizes.notes if sizes is not None else []))


def merged(verdicts, more):
    """``verdicts`` with the signatures checked in ``more`` added to the same ops' (an op only ``more`` saw: its
    own verdict)."""
    by_key = {verdict.scanned.key: verdict for verdict in verdicts}
    for verdict in more:
        if verdict.scanned.key in by_key:
            by_key[verdict.scanned.key].checked.extend(verdict.checked)
        else:
            verdicts.append(verdict)
    return verdicts


def select_checks(registry, checks, skip):
    known = registry.names()
    names = [checks] if isinstance(checks, str) else list(checks or known)
    skipped = [skip] if isinstance(skip, str) else list(skip or [])
    unknown = [name for name in names + skipped if name not in known]
    if unknown:
        raise UsageProblem(f"unknown check(s) {', '.join(map(repr, unknown))}; known checks are: {', '.join(known)}")
    return [name for name in names if name not in skipped]
