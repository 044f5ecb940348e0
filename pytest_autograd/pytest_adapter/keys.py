"""What the adapter keeps on pytest's objects: stash keys of the session's state, the marker names, and reading
back the spec each generated item carries (:mod:`item_specs`)."""

import pytest

MARKER = "autograd_op"
MODEL_MARKER = "autograd_model"
ITEM_ARG = "_autograd_item"
SETTINGS = pytest.StashKey()
REGISTRY = pytest.StashKey()
TALLY = pytest.StashKey()
TALLY_ORDER = pytest.StashKey()  # the registry's checks at start-up: the order of the summary's rows


def misused_marker(item):
    """The MisusedMarker of an item generated for a misused marker; None for every other test."""
    value = _generated(item)
    if value is None:
        return None
    from pytest_autograd.pytest_adapter.item_specs import MisusedMarker  # only an item the plugin generated

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
    if spec is None:
        return None
    from pytest_autograd.pytest_adapter.item_specs import ItemSpec  # only an item the plugin generated

    return spec if isinstance(spec, ItemSpec) else None
