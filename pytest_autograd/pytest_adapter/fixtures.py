"""The fixtures: ``autograd_check`` (the checks, called from inside any test), ``autograd_scan`` and
``autograd_device``. What a call of them does is in :mod:`fixture_calls`, imported when a test asks for one."""

import pytest

from pytest_autograd.pytest_adapter.keys import SETTINGS, item_spec


@pytest.fixture
def autograd_scan(request):
    """``autograd_scan(model, *inputs, calls=None, ops=None, skip_ops=None, checks=None, devices=None, **options)``.

    Runs the model once (and a backward), then the checks on every custom
    autograd Function and custom op it called, on the arguments they got.
    Fails the test listing every wrong op; returns the ScanResult (its
    ``verdicts``, ``wrong``, ``passed``). Devices default to where each op ran.
    """
    from pytest_autograd.pytest_adapter.fixture_calls import scan_fixture_runner

    return scan_fixture_runner(request)


@pytest.fixture
def autograd_device(request):
    """The device of the current item (``cpu``, ``cuda``, ...); the first configured one elsewhere."""
    spec = item_spec(request.node)
    if spec is not None:
        from pytest_autograd.pytest_adapter.items import (
            item_device,  # imports torch: only for marked tests
        )

        return item_device(request.node, spec)
    return request.config.stash[SETTINGS].devices[0]


@pytest.fixture
def autograd_check(request):
    """``autograd_check(op, *args, reference=None, checks=None, devices=None, samples=None, **options)``.

    Runs the checks imperatively on ``op(*args)`` (or on ``samples``, e.g.
    ``Sample(x, w, bias=b)`` or a list of them, for keyword arguments), on
    ``devices`` (default: --autograd-devices) with ``checks`` (default:
    --autograd-checks, else all). Fails the test with the same reports as the
    marker; returns the outcomes (check, device, status, detail).
    """
    from pytest_autograd.pytest_adapter.fixture_calls import fixture_runner

    return fixture_runner(request)
