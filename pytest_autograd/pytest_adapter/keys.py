"""What the adapter keeps on pytest's objects: stash keys of the session's state, and the spec of each
generated item (which check, on which device)."""

from dataclasses import dataclass

import pytest

MARKER = "autograd_op"
MODEL_MARKER = "autograd_model"
ITEM_ARG = "_autograd_item"
SETTINGS = pytest.StashKey()
REGISTRY = pytest.StashKey()
TALLY = pytest.StashKey()


@dataclass(frozen=True)
class ItemSpec:
    """Which check runs on which device for one generated item."""

    check: str
    device: str
    selected: bool  # explicitly asked for (matters for opt-in checks)
    marker: int = 0  # which autograd_op marker of the test, closest first

    def __str__(self):
        return f"{self.check}-{self.device}"


@dataclass(frozen=True)
class ModelItemSpec(ItemSpec):
    """An item of an ``autograd_model`` test: one check on every custom op the model runs, on one device."""


@dataclass(frozen=True)
class MisusedMarker:
    """The one item of a test whose marker is misused: it fails with ``problem``, and the session's other tests
    run (a collection error would stop every test of the session)."""

    problem: str

    def __str__(self):
        return "usage-error"


def misused_marker(item):
    """The MisusedMarker of an item generated for a misused marker; None for every other test."""
    value = _generated(item)
    return value if isinstance(value, MisusedMarker) else None


def _generated(item):
    """What the plugin's parametrization gave ``item`` (None for a test it did not generate)."""
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(ITEM_ARG)


def item_spec(item):
    """The ItemSpec of a generated item; None for other tests.

    When a marker's ``checks=`` and ``--autograd-checks`` share no check, the
    parametrization is empty and pytest fills the slot with a NOTSET
    placeholder (the item is then skipped as an empty parameter set).
    """
    spec = _generated(item)
    return spec if isinstance(spec, ItemSpec) else None
