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

One case is kept at a time, and let go after the test's last item on that
device. Items run in another order (pytest-randomly) build the case again;
under pytest-xdist a check does work for another only with ``--dist
loadgroup``, which keeps a test's items on one worker.
"""

import dataclasses

import pytest

from pytest_autograd.engine.seeding import item_seed
from pytest_autograd.pytest_adapter.keys import item_spec
from pytest_autograd.pytest_adapter.record import test_name

ITEMS_OF_TEST = pytest.StashKey()  # (test, marker, device) -> the checks of its collected items, in order
KEPT = pytest.StashKey()  # [key, case, items run] of the case kept, or None


@dataclasses.dataclass(frozen=True)
class TestKey:
    """What the items sharing one case have in common."""

    test: str  # the node id without the check-device part of the parameters
    marker: int
    device: str


def test_key(item, spec, device):
    return TestKey(test_name(item.nodeid, str(spec)), spec.marker, device)


def record_items(session):
    """Note, once collection (and deselection) is done, which checks each test runs on each device."""
    found = {}
    for item in session.items:
        spec = item_spec(item)
        if spec is not None and type(spec).__name__ == "ItemSpec":
            found.setdefault((test_name(item.nodeid, str(spec)), spec.marker, spec.device), []).append(spec.check)
    session.config.stash[ITEMS_OF_TEST] = {key: tuple(checks) for key, checks in found.items()}
    session.config.stash[KEPT] = None


def samples_seed(base_seed, key):
    """The seed the test body builds its samples under: one per test, whatever the check or device."""
    return item_seed(base_seed, f"samples:{key.test}:{key.marker}")


def shared_case(item, spec, key, base_seed, build):
    """The case of ``key``'s items: the one an earlier item built, else ``build()``'s, kept for the items after."""
    config = item.config
    checks = config.stash.get(ITEMS_OF_TEST, {}).get((key.test, key.marker, spec.device), ())
    kept = config.stash.get(KEPT, None)
    if kept is not None and kept[0] == key:
        case = kept[1]
    else:
        config.stash[KEPT] = None  # let the last test's case go before this one's is built
        case = build()
        seed = samples_seed(base_seed, key)
        case.shared_seed = item_seed(seed, "shared")
        case.run_options = dataclasses.replace(case.run_options, checks=checks if _shares_work(config) else None)
        kept = config.stash[KEPT] = [key, case, 0]
    kept[2] += 1
    if kept[2] >= len(checks):
        config.stash[KEPT] = None  # the test's last item on this device: nothing after it wants the case
    return case


def _shares_work(config):
    """Whether a check may do work for the checks after it: they run in this process (under pytest-xdist only
    ``--dist loadgroup`` keeps a test's items on one worker)."""
    if not hasattr(config, "workerinput"):
        return True
    return config.getoption("dist", None) == "loadgroup"
