"""One case per test and device, shared by the test's items: the checks share work on the same samples.

Under pytest every check is an item of its own. Each item calls the test
body (so what the body sets up, a monkeypatch or a flag, holds for its own
check), under one seed for the whole test, not the item's: the items of one
test and device get the same sample values, as the checks of one
``run_checks`` call do. The case built from them is kept while that test's
items run, used again by an item whose call gave the same samples, and with
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
from pytest_autograd.pytest_adapter.item_specs import ItemSpec
from pytest_autograd.pytest_adapter.keys import item_spec
from pytest_autograd.pytest_adapter.record import test_name

ITEMS_OF_TEST = pytest.StashKey()  # (test, marker, device) -> the checks of its collected items, in order
KEPT = pytest.StashKey()  # TestKey -> [case, items run, the samples it was built from], all of one test


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


def ends_its_test(item, nextitem):
    """Whether no item of ``item``'s test comes right after it (any item that is not an ``autograd_op`` one ends
    its own test)."""
    test = _checked_test(item)
    return test is None or nextitem is None or _checked_test(nextitem) != test


def group_items_by_test(items):
    """Put the items of each test next to each other, in place, keeping every other order: pytest runs a test
    parametrized by its author check by check (``test_x[gradcheck-cpu-2]``, ``test_x[gradcheck-cpu-3]``,
    ``test_x[reference-cpu-2]``...), and a case is kept only while its test's items run."""
    groups = {}
    for item in items:
        groups.setdefault(_checked_test(item) or id(item), []).append(item)
    items[:] = [item for group in groups.values() for item in group]


def record_items(session):
    """Note, once collection (and deselection) is done, which checks each test runs on each device (an item marked
    to skip, e.g. bench with benchmarks off, never asks for the case)."""
    found = {}
    for item in session.items:
        test = _checked_test(item)
        if test is not None and item.get_closest_marker("skip") is None:
            spec = item_spec(item)
            found.setdefault((test, spec.marker, spec.device), []).append(spec.check)
    session.config.stash[ITEMS_OF_TEST] = {key: tuple(checks) for key, checks in found.items()}
    session.config.stash[KEPT] = {}


def samples_seed(base_seed, key):
    """The seed the test body builds its samples under: one per test, whatever the check or device."""
    return item_seed(base_seed, f"samples:{key.test}:{key.marker}")


def shared_case(item, spec, key, seed, samples, build):
    """The case of ``key``'s items: the one an earlier item built from the same ``samples`` (what this item's call
    of the test body gave under ``seed``, the test's ``samples_seed``), else ``build()``'s, kept for the items
    after."""
    config = item.config
    checks = _checks_of(config, key, spec)
    kept = config.stash.setdefault(KEPT, {})
    if key in kept and not same_samples(kept[key][2], samples):
        del kept[key]  # the body gave other values this time (drawn without the seeded generators): start anew
    if key not in kept:
        if any(other.test != key.test for other in kept):
            kept.clear()  # let another test's cases go before this one's is built
        case = build()
        case.shared_seed = item_seed(seed, "shared")
        case.run_options = dataclasses.replace(case.run_options, checks=checks if _shares_work(config) else None)
        kept[key] = [case, 0, samples]
    entry = kept[key]
    _count(config, key, checks)
    return entry[0]


def kept_case(config, key):
    """The case an earlier item of ``key``'s test built, while it is kept; else None."""
    entry = config.stash.get(KEPT, {}).get(key)
    return None if entry is None else entry[0]


def passed_over(item, spec, key):
    """An item of ``key``'s test that skips before asking for the case (an opt-in check nobody selected): counted,
    so that the case is let go after the test's last item all the same."""
    config = item.config
    if key in config.stash.get(KEPT, {}):
        _count(config, key, _checks_of(config, key, spec))


def _checks_of(config, key, spec):
    """The checks of ``key``'s collected items (by the device they were generated for, ``spec.device``)."""
    return config.stash.get(ITEMS_OF_TEST, {}).get((key.test, key.marker, spec.device), ())


def _count(config, key, checks):
    entry = config.stash[KEPT][key]
    entry[1] += 1
    if entry[1] >= len(checks):
        del config.stash[KEPT][key]  # the test's last item on this device: nothing after it wants the case


def same_samples(kept, given):
    """Whether two calls of a test body gave the same samples: equal tensors (dtype, shape, device, values; a NaN
    never equals itself, so a sample holding one is not shared) and equal other arguments."""
    if len(kept) != len(given):
        return False
    return all(_same(a.args, b.args) and _same(a.kwargs, b.kwargs) for a, b in zip(kept, given))


def _same(a, b):
    import torch  # only reached from an item that runs a check

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and a.layout == b.layout == torch.strided
                and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b) is True
    except Exception:  # an object whose == raises or is not a truth value: not known to be the same
        return False


def _shares_work(config):
    """Whether a check may do work for the checks after it: they run in this process (under pytest-xdist only
    ``--dist loadgroup`` keeps a test's items on one worker)."""
    if not hasattr(config, "workerinput"):
        return True
    return config.getoption("dist", None) == "loadgroup"
