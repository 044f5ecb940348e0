"""One case per test and device, shared by the test's items: the test body runs once, and the checks share work.

Under pytest every check is an item of its own. The items of one test and
device build their samples under one seed, the test's (not the item's), so
they judge the same sample values, as the checks of one ``run_checks`` call
do. The case built from them is kept while that test's items run, and with
it the work one check leaves for another: gradgradcheck finds gradcheck's
float64 forward, first gradients and probes (``checks/_first_order``),
precision finds reference's runs (``checks/_reference_runs``), and the
float64 plan is tried once. That work is seeded by the test too, so a check
gives the same verdict run alone (``-k``, ``--autograd-checks``) as beside the
others; each check's own draws still come from its item's seed.

The items of a test (with its own parameters: ``test_x[gradcheck-cpu-2]``
and ``test_x[reference-cpu-2]``) are collected next to each other, and its
cases (one per device) are kept until its last item on that device, or until
an item of another test runs. Items run in another order (pytest-randomly)
build the case again; under pytest-xdist a check does work for another only
with ``--dist loadgroup``, which keeps a test's items on one worker.
"""

import dataclasses

import pytest

from pytest_autograd.engine.seeding import item_seed
from pytest_autograd.pytest_adapter.keys import ItemSpec, item_spec
from pytest_autograd.pytest_adapter.record import test_name

ITEMS_OF_TEST = pytest.StashKey()  # (test, marker, device) -> the checks of its collected items, in order
KEPT = pytest.StashKey()  # TestKey -> [case, items run] of the cases kept, all of one test


@dataclasses.dataclass(frozen=True)
class TestKey:
    """What the items sharing one case have in common."""

    test: str  # the node id without the check-device part of the parameters
    marker: int
    device: str


def test_key(item, spec, device):
    return TestKey(test_name(item.nodeid, str(spec)), spec.marker, device)


def _checked_test(item):
    """The test an ``autograd_op`` item checks (None for any other item)."""
    spec = item_spec(item)
    if spec is None or type(spec) is not ItemSpec:
        return None
    return test_name(item.nodeid, str(spec))


def group_items_by_test(items):
    """Put the items of each test next to each other, in place, keeping every other order: pytest runs a test
    parametrized by its author check by check (``test_x[gradcheck-cpu-2]``, ``test_x[gradcheck-cpu-3]``,
    ``test_x[reference-cpu-2]``...), and a case is kept only while its test's items run."""
    groups = {}
    for item in items:
        groups.setdefault(_checked_test(item) or id(item), []).append(item)
    items[:] = [item for group in groups.values() for item in group]


def record_items(session):
    """Note, once collection (and deselection) is done, which checks each test runs on each device."""
    found = {}
    for item in session.items:
        test = _checked_test(item)
        if test is not None:
            spec = item_spec(item)
            found.setdefault((test, spec.marker, spec.device), []).append(spec.check)
    session.config.stash[ITEMS_OF_TEST] = {key: tuple(checks) for key, checks in found.items()}
    session.config.stash[KEPT] = {}


def samples_seed(base_seed, key):
    """The seed the test body builds its samples under: one per test, whatever the check or device."""
    return item_seed(base_seed, f"samples:{key.test}:{key.marker}")


def shared_case(item, spec, key, base_seed, build):
    """The case of ``key``'s items: the one an earlier item built, else ``build()``'s, kept for the items after."""
    config = item.config
    checks = config.stash.get(ITEMS_OF_TEST, {}).get((key.test, key.marker, spec.device), ())
    kept = config.stash.setdefault(KEPT, {})
    if key not in kept:
        if any(other.test != key.test for other in kept):
            kept.clear()  # let another test's cases go before this one's is built
        case = build()
        case.shared_seed = item_seed(samples_seed(base_seed, key), "shared")
        case.run_options = dataclasses.replace(case.run_options, checks=checks if _shares_work(config) else None)
        kept[key] = [case, 0]
    entry = kept[key]
    entry[1] += 1
    if entry[1] >= len(checks):
        del kept[key]  # the test's last item on this device: nothing after it wants the case
    return entry[0]


def _shares_work(config):
    """Whether a check may do work for the checks after it: they run in this process (under pytest-xdist only
    ``--dist loadgroup`` keeps a test's items on one worker)."""
    if not hasattr(config, "workerinput"):
        return True
    return config.getoption("dist", None) == "loadgroup"
