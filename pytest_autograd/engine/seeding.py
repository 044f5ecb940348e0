"""Seeds for torch, ``random`` and numpy (a test's samples, an item's check), restored afterwards.

A test body may build its samples with any of the three generators; seeding
all of them is what makes the printed ``rerun:`` command reproduce the
samples. Their states are restored afterwards, so an item's seed never leaks
into the unmarked tests that run after it.
"""

import contextlib
import random
import zlib


def item_seed(base_seed, nodeid):
    return zlib.crc32(f"{base_seed}:{nodeid}".encode()) & 0x7FFFFFFF


def draw_random_seed():
    return random.SystemRandom().randrange(2**31)


def _numpy_random():
    try:
        import numpy.random
    except ImportError:
        return None
    return numpy.random


def seed_torch(seed):
    """``torch.manual_seed(seed)`` for the generators this process can use: the CPU's, and those of CUDA, MPS and
    XPU where available.

    ``torch.manual_seed`` also queues a seeding for every backend that is not
    initialised (CUDA on a machine without one, XPU, MTIA), formatting the
    Python stack for each: 1 to 7 ms a call under pytest's deep stack, paid
    by every item, and the queue only grows in a process that never
    initialises them.
    """
    import torch

    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        xpu.manual_seed_all(seed)


@contextlib.contextmanager
def seeded(seed):
    """Seed torch (CPU and every CUDA device), ``random`` and numpy; restore all on exit."""
    import torch

    numpy_random = _numpy_random()
    python_state = random.getstate()
    numpy_state = numpy_random.get_state() if numpy_random is not None else None
    cuda_devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda_devices):
        seed_torch(seed)
        random.seed(seed)
        if numpy_random is not None:
            numpy_random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy_random is not None:
                numpy_random.set_state(numpy_state)
