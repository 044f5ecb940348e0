"""What the ``autograd_check`` and ``autograd_scan`` fixtures do when a test calls them: run the checks (or the
scan) with the session's options and turn the outcomes into pytest's. Imported when a test asks for a fixture."""

import pytest

from pytest_autograd.engine.case import RunOptions
from pytest_autograd.engine.outcomes import UsageProblem
from pytest_autograd.engine.seeding import item_seed
from pytest_autograd.pytest_adapter import shrinking
from pytest_autograd.pytest_adapter.keys import REGISTRY, SETTINGS
from pytest_autograd.pytest_adapter.rerun import pytest_command
from pytest_autograd.pytest_adapter.skipping import skip_here
from pytest_autograd.pytest_adapter.timeout import item_seconds


def all_skipped_reason(outcomes):
    """Why a fixture call that ran no check at all is a skip, not a pass: each distinct reason once, with
    the checks it stopped."""
    by_reason = {}
    for outcome in outcomes:
        by_reason.setdefault(outcome.detail, []).append(f"{outcome.check}-{outcome.device}")
    reasons = "; ".join(f"{reason} ({_names(items)})" for reason, items in by_reason.items())
    return f"autograd_check: every check was skipped, so nothing was checked: {reasons}"


def _names(items, shown=4):
    if len(items) <= shown:
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more"


def fixture_runner(request):
    from pytest_autograd.engine.api import (
        run_checks,  # imports torch: only when a test asks for the fixture
    )

    settings = request.config.stash[SETTINGS]
    registry = request.config.stash[REGISTRY].visible_from(request.node.path)

    def autograd_check(op, *args, reference=None, checks=None, devices=None, samples=None, **options):
        problem = None
        devices = devices or settings.devices
        try:
            outcomes = run_checks(op, *args, reference=reference, checks=checks or settings.checks,
                                  devices=devices, samples=samples,
                                  seed=item_seed(settings.seed, request.node.nodeid), registry=registry,
                                  run_options=RunOptions(seconds=item_seconds(request.config),
                                                         devices=tuple(settings.devices),
                                                         shrink_seconds=shrinking.shrink_seconds(request.config),
                                                         repro_dir=shrinking.repro_dir(request.config)),
                                  **options)
        except UsageProblem as raised:
            problem = str(raised)
        if problem is not None:
            if not problem.startswith("autograd_check:"):
                problem = f"autograd_check: {problem}"
            pytest.fail(problem, pytrace=False)
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            body = "\n\n".join(o.detail for o in failed)
            rerun = pytest_command(request.config, request.node.nodeid, f"--autograd-seed={settings.seed}")
            pytest.fail(f"autograd_check: {len(failed)} check(s) failed\n\n{body}\n  rerun: {rerun}", pytrace=False)
        if outcomes and all(o.status == "skipped" for o in outcomes):
            skip_here(all_skipped_reason(outcomes))
        return outcomes

    return autograd_check


def scan_fixture_runner(request):
    from pytest_autograd.engine.model_scan import (  # imports torch: only when a test asks for the fixture
        NothingToCheck,
        autograd_scan,
    )

    settings = request.config.stash[SETTINGS]
    registry = request.config.stash[REGISTRY].visible_from(request.node.path)

    def scan(model, *inputs, checks=None, **options):
        problem = None
        try:
            result = autograd_scan(model, *inputs, checks=checks or settings.checks, registry=registry,
                                   seed=item_seed(settings.seed, request.node.nodeid),
                                   run_options=RunOptions(seconds=item_seconds(request.config),
                                                          devices=tuple(settings.devices)), **options)
        except UsageProblem as raised:
            problem = str(raised)
        except NothingToCheck as nothing:
            skip_here(nothing.reason)
        if problem is not None:
            pytest.fail(problem if problem.startswith("autograd_scan:") else f"autograd_scan: {problem}", pytrace=False)
        if result.wrong:
            rerun = pytest_command(request.config, request.node.nodeid, f"--autograd-seed={settings.seed}")
            pytest.fail(f"autograd_scan: {result.render(brief=True)}\n  rerun: {rerun}", pytrace=False)
        if not result.passed:
            skip_here(f"autograd_scan: every check was skipped on every op, so nothing was checked:\n{result.render()}")
        return result

    return scan
