"""The model scan's own options (``autograd_model`` marker, ``autograd_scan``) and their validation.

Imports no torch: the marker is validated at collection.
"""

from pytest_autograd.engine.case import CORE_OPTIONS, validate_tolerances
from pytest_autograd.engine.distributed import given_options
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.results.naming import did_you_mean

DEFAULT_MAX_SIGNATURES = 4
# The scan's own options; every other option goes to each op's checks.
SCAN_OPTIONS = {"ops": None, "skip_ops": None, "max_signatures": DEFAULT_MAX_SIGNATURES, "op_options": None,
                "autocast": None}
AUTOCAST_DTYPES = ("torch.float16", "torch.bfloat16")  # what autocast= may name (compared by name: no torch here)
# Options that only make sense for one op: given per op in op_options=, never for the whole model.
PER_OP_ONLY = ("reference", "constants", "size_samples")
# Options of a whole scan that are not the checks' (they are the item's or the scan's).
NOT_PER_OP = ("op", "devices", "checks", "skip")


def autocast_check_options(options, autocast):
    """The autocast check's options in a scan with ``autocast=``: judged in the dtype the model's step runs in, unless
    the options choose the dtypes themselves."""
    return {**options, "autocast_dtypes": options.get("autocast_dtypes") or (autocast,)}


def op_options_known(registry, names):
    """Options an op's checks understand: the core's (less those of the whole scan) and the checks'."""
    known = set(CORE_OPTIONS) - set(NOT_PER_OP)
    for name in names:
        known.update(getattr(registry.get(name), "options", {}) or {})
    return known


def validate_scan_options(options, where, known):
    """The scan's options and the checks' options it passes on; raise UsageProblem naming the fix.

    ``known``: the options the checks understand (per op); every other key
    of ``options`` must be one of the scan's own.
    """
    for name in PER_OP_ONLY:
        if options.get(name) is not None:
            raise UsageProblem(f"{where}: {name}= applies to one op, not to a whole model; give it for that op: "
                               f"op_options={{'MyOp': {{'{name}': ...}}}} (keyed by the op's name or object).")
    allowed = (set(known) - set(PER_OP_ONLY)) | set(SCAN_OPTIONS) | {"checks", "skip", "devices", "xfail"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise UsageProblem(f"{where}: unknown option(s) {', '.join(unknown)}{did_you_mean(unknown, allowed)}; "
                           f"known options are: {', '.join(sorted(allowed))}.")
    max_signatures = options.get("max_signatures", DEFAULT_MAX_SIGNATURES)
    if max_signatures is not None and (isinstance(max_signatures, bool) or not isinstance(max_signatures, int)
                                       or max_signatures < 1):
        raise UsageProblem(f"{where}: max_signatures= must be a positive int (signatures checked per op) or None "
                           f"for all of them, got {max_signatures!r}.")
    across = given_options(options)
    if across:
        raise UsageProblem(f"{where}: {', '.join(across)}= check one op across ranks; a model scan runs the model in "
                           "one process: check such an op with @pytest.mark.autograd_op(op=..., world_size=..., "
                           "placements=...) (see docs/distributed.md).")
    if options.get("isolate") is not None:
        from pytest_autograd.engine.isolate_modes import isolate_problem

        problem = isolate_problem(options["isolate"], f"{where}: isolate=")
        if problem:
            raise UsageProblem(problem)
    autocast = options.get("autocast")
    if autocast is not None and str(autocast) not in AUTOCAST_DTYPES:
        raise UsageProblem(f"{where}: autocast= must be torch.float16 or torch.bfloat16 (the dtype the model's "
                           f"forward runs under torch.autocast in, as a mixed-precision training step runs it), got "
                           f"{autocast!r}.")
    for name in ("ops", "skip_ops"):
        _validate_op_entries(options.get(name), name, where)
    validate_tolerances(options, where)
    _validate_op_options(options.get("op_options"), where, known)


def _validate_op_entries(value, name, where):
    if value is None:
        return
    entries = list(value) if isinstance(value, (list, tuple, set, frozenset)) else [value]
    if not entries and name == "ops":
        raise UsageProblem(f"{where}: {name}= is empty; name ops by their name (e.g. 'MyRMSNorm', "
                           "'mylib::fused_swiglu') or pass the Function class or torch.ops operator.")
    for entry in entries:
        if not isinstance(entry, str) and not callable(entry):
            raise UsageProblem(f"{where}: {name}= entry {entry!r} is neither a name nor an op; name ops by their "
                               "name (e.g. 'MyRMSNorm', 'mylib::fused_swiglu') or pass the Function class or "
                               "torch.ops operator.")


def _validate_op_options(op_options, where, known):
    if op_options is None:
        return
    if not isinstance(op_options, dict):
        raise UsageProblem(f"{where}: op_options= must map an op (its name or object) to a dict of options, "
                           f"e.g. op_options={{'MyRMSNorm': {{'atol': 1e-3}}}}, got {op_options!r}.")
    for entry, per_op in op_options.items():
        _validate_op_entries([entry], "op_options", where)
        if not isinstance(per_op, dict):
            raise UsageProblem(f"{where}: op_options= for {entry!r} must be a dict of options, got {per_op!r}.")
        unknown = sorted(set(per_op) - set(known))
        if unknown:
            raise UsageProblem(f"{where}: op_options= for {entry!r} has unknown option(s) {', '.join(unknown)}"
                               f"{did_you_mean(unknown, known)}; known options are: {', '.join(sorted(known))}.")
        validate_tolerances(per_op, where)
