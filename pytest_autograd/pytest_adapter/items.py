"""Running one generated item: its device, seed and samples, the check, and the pytest outcome."""

import itertools
import os
import warnings

import pytest

from pytest_autograd.checks.base import CheckContext
from pytest_autograd.engine import notes
from pytest_autograd.engine.after_failure import follow_up
from pytest_autograd.engine.case import RunOptions, build_case, normalise_samples
from pytest_autograd.engine.distributed import CALL_SECONDS, reason_not_run, world_size
from pytest_autograd.engine.devices import device_problem, physical_gpu, worker_device
from pytest_autograd.engine.modules import with_parameters
from pytest_autograd.engine.notes import AutogradNote
from pytest_autograd.engine.outcomes import CheckSkipped, UsageProblem
from pytest_autograd.engine.running import run_check
from pytest_autograd.engine.sample_values import validate_sample_values
from pytest_autograd.engine.seeding import item_seed, seeded
from pytest_autograd.pytest_adapter import root_cause, shrinking
from pytest_autograd.pytest_adapter.bench import state_of as bench_state_of
from pytest_autograd.pytest_adapter.keys import MARKER, SETTINGS, item_spec
from pytest_autograd.pytest_adapter.record import without_group
from pytest_autograd.pytest_adapter.reporting import attach_picture, remember_for_record
from pytest_autograd.pytest_adapter.rerun import pytest_command
from pytest_autograd.pytest_adapter.shared_cases import kept_case, passed_over, samples_seed, shared_case, test_key
from pytest_autograd.pytest_adapter.skipping import skip_here
from pytest_autograd.results.plots import picture_name
from pytest_autograd.pytest_adapter.timeout import item_seconds

NOTES_SECTION = "autograd notes"


def rerun_command(item, base_seed, spec=None, check=None, device=None):
    """A command that regenerates this very item: same node id, same seed, same GPU.

    A non-CPU item only exists when its device is asked for, and an opt-in
    check only runs when selected, so those options are part of the command.
    An xdist worker that ran ``cuda`` on its own GPU (``device`` cuda:N) gets
    the rerun pinned to that GPU with CUDA_VISIBLE_DEVICES.
    """
    options = [f"--autograd-seed={base_seed}"]
    if spec is not None and spec.device.split(":")[0] != "cpu":
        options.append(f"--autograd-devices={spec.device}")
    if spec is not None and check is not None and not getattr(check, "default", True):
        options.append(f"--autograd-checks={spec.check}")
    command = pytest_command(item.config, without_group(item.nodeid), *options)
    if spec is not None and device is not None and device != spec.device:
        gpu = physical_gpu(int(device.split(":")[1]), os.environ.get("CUDA_VISIBLE_DEVICES"))
        command = f"CUDA_VISIBLE_DEVICES={gpu} {command}"
    return command


def item_device(item, spec):
    """The device this item runs on: under pytest-xdist a bare ``cuda`` is the worker's own GPU."""
    workerid = getattr(item.config, "workerinput", {}).get("workerid", "")
    if spec.device != "cuda" or not workerid.startswith("gw"):
        return spec.device
    return worker_device(spec.device, int(workerid[2:]), gpu_count())


def gpu_count():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def call_body(item, **overrides):
    names = item._fixtureinfo.argnames
    return item.obj(**{**{name: item.funcargs[name] for name in names}, **overrides})


def run_options(config):
    """The engine's options for every item of this session."""
    settings = config.stash.get(SETTINGS, None)
    return RunOptions(seconds=item_seconds(config), devices=tuple(settings.devices) if settings else ("cpu",),
                      bench=bench_state_of(config), shrink_seconds=shrinking.shrink_seconds(config),
                      repro_dir=shrinking.repro_dir(config), isolate=settings.isolate if settings else "explore")


def run_item(item, spec, settings, registry):
    device = item_device(item, spec)
    problem = device_problem(device)
    if problem and settings.require_devices:
        pytest.fail(f"{problem} (--autograd-require-devices makes an absent device an error)", pytrace=False)
    if problem:
        skip_here(problem)
    check = selected_check(registry, spec, lambda: passed_over(item, spec, test_key(item, spec, device)))
    seed = item_seed(settings.seed, item.nodeid)
    with seeded(seed):
        _run_seeded(item, spec, device, settings, check, seed)


RUN_TOKEN = pytest.StashKey()
_RUN_TOKENS = itertools.count()


def run_token(config):
    """A number naming this pytest run: what its items share stays theirs (pytester runs several in one process),
    without keeping the run alive."""
    if RUN_TOKEN not in config.stash:
        config.stash[RUN_TOKEN] = next(_RUN_TOKENS)
    return config.stash[RUN_TOKEN]


def selected_check(registry, spec, on_skip=None):
    """The item's check; an opt-in check the user did not select skips the item saying how to select it (after
    ``on_skip()``)."""
    check = registry.get(spec.check)
    if not getattr(check, "default", True) and not spec.selected:
        if on_skip is not None:
            on_skip()
        skip_here(f"{spec.check} is opt-in: select it with --autograd-checks={spec.check} or checks=[...] on the marker")
    return check


def _run_seeded(item, spec, device, settings, check, seed):
    where = item.nodeid
    try:
        _skip_if_it_does_not_apply_to_the_kept_case(item, spec, device, check)
        case = _case(item, spec, device, settings)
        reason = reason_not_run(check, case, device)
        if reason:
            skip_here(reason)
        rerun = rerun_command(item, settings.seed, spec, check, device)
        remember_for_record(item, seed, rerun)
        context = CheckContext(check.name, case, device, seed)
        failure = run_check(check, context)
        show_notes(item, list(dict.fromkeys(context.notes + notes.pending())))
        problem = None
    except UsageProblem as raised:
        problem = str(raised)
    except CheckSkipped as skipped:
        skip_here(skipped.reason)
    if problem is not None:
        fail_usage_problem(item, spec, problem)
    if failure is not None:
        summary = failure.report.summary
        pointer = root_cause.pointer_to_first(item, spec, root_cause.cause_of_failure(summary), summary)
        if pointer:
            pytest.fail(pointer, pytrace=False)
        failure.report.nodeid = where
        position = notes.count()
        follow_up(check, context, failure, picture_name(where))
        notes.forget_since(position)  # the shrinking runs' notes are not this item's
        failure.report.repro = shown_path(failure.report.repro, item.config.invocation_params.dir)
        attach_picture(failure.report, item.config, where)
        _fail(failure, rerun, where, seed)


def _skip_if_it_does_not_apply_to_the_kept_case(item, spec, device, check):
    """Skip, without calling the test body, an item whose check does not apply to the case an earlier item of the
    test built (parity on one device, forward_ad on an op without jvp): on a large sample the body's call is what
    such an item costs. An item with no kept case asks its own."""
    key = test_key(item, spec, device)
    case = kept_case(item.config, key)
    if case is None:
        return
    reason = reason_not_run(check, case, device)
    if reason:
        passed_over(item, spec, key)
        skip_here(reason)


def shown_path(path, directory):
    """``path`` relative to where pytest was started when it lies below it (shorter to read and to paste)."""
    if path is None:
        return None
    try:
        return os.path.relpath(path, directory) if not os.path.relpath(path, directory).startswith("..") else path
    except ValueError:  # another drive
        return path


def fail_usage_problem(item, spec, problem):
    """Fail with a usage problem: in full on the first item of the test that met it, as a pointer on the rest."""
    headline = problem.replace(f"{item.nodeid}: ", "")
    cause = root_cause.cause_of_usage_problem(problem, item.nodeid)
    pytest.fail(root_cause.pointer_to_first(item, spec, cause, headline) or problem, pytrace=False)


def show_notes(item, texts):
    """Each note once: a warning at the test's own line, the item's report section, JUnit XML properties."""
    if not texts:
        return
    warn_notes(item, texts)
    item.add_report_section("call", NOTES_SECTION, "\n".join(texts))
    item.user_properties.extend(("autograd_note", text) for text in texts)


def warn_notes(item, texts):
    """Each note as an AutogradNote warning at the test's own line (the warnings summary)."""
    filename, lineno = test_location(item)
    with warnings.catch_warnings():  # pytest still records it; "always" keeps -W error from raising it
        warnings.simplefilter("always", AutogradNote)
        for text in texts:
            warnings.warn_explicit(AutogradNote(text), AutogradNote, filename, lineno)


def test_location(item):
    """(file, line) of the test function's definition, where a user looks; the item's location otherwise."""
    code = getattr(getattr(item, "function", None), "__code__", None)
    if code is not None:
        return code.co_filename, code.co_firstlineno
    path, line, _ = item.location
    return str(item.config.rootpath / path), (line or 0) + 1


def marker_of(item, spec):
    """The autograd_op marker this item checks (a test may carry several)."""
    marks = list(item.iter_markers(MARKER))
    index = getattr(spec, "marker", 0)
    return marks[index] if index < len(marks) else marks[0]


def _case(item, spec, device, settings):
    """The case this item checks, from the samples its own call of the test body gives under the test's seed (so
    whatever the body sets up, a monkeypatch or a flag, holds for this item's check): the case an earlier item of
    the test built from the same samples, with the work done on it (see ``shared_cases``), else a new one."""
    key = test_key(item, spec, device)
    seed = samples_seed(settings.seed, key)
    with seeded(seed):
        given = normalise_samples(call_body(item), item.nodeid)

    def build():
        with seeded(seed):
            built = _build_case(item, marker_of(item, spec), device, item.nodeid, given)
        built.shared_by = (run_token(item.config), key.test, key.marker)  # the test with its own parameters: what
        # one parameter set shows about the op (its float64 plan) is not another's
        return built

    case = shared_case(item, spec, key, seed, given, build)
    _bind_factory(case, item, item.nodeid)  # this item's fixtures, not those of the item that built the case
    return case


def _bind_factory(case, item, where):
    case.factory = lambda **overrides: with_parameters(case.op, normalise_samples(call_body(item, **overrides), where))


def _build_case(item, mark, device, where, samples):
    """The OpCase of the samples the test body gave, as the hooks adjust them for this device."""
    case = build_case(mark.kwargs, samples, where)
    case.run_options = run_options(item.config)
    case.origin = op_on_marker(item)
    if world_size(case):  # an op across ranks: they find it, and the project's rank setup, by reference
        case.op.origin = case.origin
        case.op.layout.setups = rank_setups(item.config)
        case.op.layout.seconds = min(CALL_SECONDS, case.run_options.seconds or CALL_SECONDS)
    _bind_factory(case, item, where)
    for adjusted in item.config.hook.pytest_autograd_adjust_samples(case=case, device=device):
        if adjusted is not None:
            case.samples = with_parameters(case.op, normalise_samples(adjusted, where))
            validate_sample_values(case, where)
            break
    return case


def rank_setups(config):
    """The functions implementing ``pytest_autograd_setup_rank``, for the ranks to call."""
    return tuple(impl.function for impl in config.pluginmanager.hook.pytest_autograd_setup_rank.get_hookimpls())


def op_on_marker(item):
    """Where another process finds the op of ``item``'s marker: its test module, the test's name there, and the
    marker's place among the test's ``autograd_op`` markers (as ``iter_markers`` lists them)."""
    from pytest_autograd.engine.processes.transport import FromTestMarker

    module = getattr(getattr(item, "module", None), "__name__", None)
    if module is None:
        return None
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    test = f"{item.cls.__name__}.{name}" if getattr(item, "cls", None) is not None else name
    spec = item_spec(item)
    return FromTestMarker(module, test, MARKER, getattr(spec, "marker", 0))


def _fail(failure, rerun, nodeid, seed=None):
    report = failure.report
    if report.seed is None:
        report.seed = seed
    report.rerun = report.rerun or rerun
    report.nodeid = nodeid
    failed = pytest.fail.Exception(report.render(), pytrace=False)
    failed.autograd_report = report  # the structured fields, for the JSON record
    raise failed
