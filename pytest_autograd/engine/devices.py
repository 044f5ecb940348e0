"""Device names: parsing what a user writes (``cuda:1``, a ``torch.device``, a list) and whether a device
can run here. Parsing imports no torch."""

import re

from pytest_autograd.engine.outcomes import UsageProblem

DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "npu")
_DEVICE = re.compile(r"^(?P<kind>[a-z]+)(:(?P<index>\d+))?$")


def split_names(text):
    return [part.strip() for part in str(text).split(",") if part.strip()]


def parse_devices(text, source):
    devices = split_names(text)
    if not devices:
        raise UsageProblem(f"{source}: no device given; use e.g. --autograd-devices=cpu,cuda")
    for device in devices:
        match = _DEVICE.match(device)
        if match is None or match.group("kind") not in DEVICE_TYPES:
            from pytest_autograd.results.naming import did_you_mean  # a mistake's message only: start-up stays lean

            raise UsageProblem(
                f"{source}: unknown device {device!r}{did_you_mean([device], DEVICE_TYPES)}; "
                f"use one of {', '.join(DEVICE_TYPES)}, "
                "optionally with an index such as cuda:1"
            )
    return list(dict.fromkeys(devices))


def devices_option(value, source):
    """``devices=`` as a marker or fixture gives it: a name, a ``torch.device``, or a list of either."""
    if not isinstance(value, (list, tuple, set, frozenset)):
        value = [value]
    return parse_devices(",".join(map(str, value)), source)


def device_problem(device):
    """None when ``device`` can run here, else why not."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    import torch

    backend = getattr(torch, kind, None)
    if kind == "mps":
        available = torch.backends.mps.is_available()
        count = 1 if available else 0
    elif backend is not None and hasattr(backend, "is_available"):
        available = backend.is_available()
        count = backend.device_count() if available and hasattr(backend, "device_count") else int(available)
    else:
        return f"this torch build has no {kind!r} backend"
    if not available:
        built = ""
        if kind == "cuda":
            built = f" (torch {torch.__version__} is built {'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'})"
        return f"device {device!r} was asked for but {kind.upper()} is not available{built}"
    if index and int(index) >= count:
        return f"device {device!r} was asked for but only {count} {kind} device(s) exist"
    return None


def cuda_devices(device):
    """The CUDA device indices whose RNG state fork_rng must save for ``device``."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return [torch.device(device).index or 0]
    return []


def worker_device(device, worker_index, device_count):
    """The device a parallel worker uses for ``device``.

    A bare ``cuda`` means the worker's own GPU: worker N of a pytest-xdist
    run gets ``cuda:(N mod device_count)``, so eight workers on an eight-GPU
    machine use eight GPUs instead of sharing cuda:0. An index the user wrote
    (``cuda:1``), any other device, a serial run (``worker_index`` None) or a
    single GPU leave the device as it is.
    """
    if device != "cuda" or worker_index is None or device_count < 2:
        return device
    return f"cuda:{worker_index % device_count}"


def physical_gpu(index, visible=None):
    """The GPU that CUDA index ``index`` is, given ``CUDA_VISIBLE_DEVICES`` (``visible``; None: all visible)."""
    if not visible:
        return str(index)
    names = [name.strip() for name in visible.split(",") if name.strip()]
    return names[index] if index < len(names) else str(index)

