"""What the plugin's parametrization gives each item it generates: which check runs on which device, or why the
test's marker cannot run at all. Made only for marked tests; :func:`keys.item_spec` reads them back."""

from dataclasses import dataclass


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
