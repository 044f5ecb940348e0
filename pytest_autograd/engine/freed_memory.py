"""While an op's checks run, large tensors reuse memory freed by earlier ones instead of being faulted in afresh.

A check calls the op dozens of times on float64 copies of the sample.
glibc serves a block of 32 MiB or more (a float64 tensor of 4M elements)
with a fresh mapping and unmaps it when freed, whatever its dynamic
threshold says, so the kernel faults in and zeroes every such tensor 4 KiB
at a time: on a 4M-element GELU, more time than the checks' own arithmetic.
While a check runs, glibc is told to serve every block from its heap and to
keep what is freed there (``mallopt``), so the next tensor of that size
reuses pages already mapped. When the check ends, the limits are set where
glibc's own dynamic ones settle in a process that frees large tensors
(blocks of 32 MiB or more mapped, the heap's top given back past 64 MiB
free), and what the check freed stays in the heap for the op's next check.
When the op's last check ends (``run_checks`` returns, pytest tears down a
test's last item), :func:`give_back` returns the free memory to the system
(``malloc_trim``). Giving it back after every check instead made the next
one fault it all in again: the battery took twice as long on a GELU of
256k elements.

Nothing changes where the C library is not glibc, or where the user chose
glibc's malloc settings (``MALLOC_*_`` variables or ``GLIBC_TUNABLES``):
those are theirs. ``PYTEST_AUTOGRAD_KEEP_MALLOC=1`` turns this off.
"""

import ctypes
import os
import platform
from contextlib import contextmanager
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt's parameters (malloc.h)
KEEP_ALL = 2**31 - 1  # the largest trim threshold mallopt takes: freed memory stays in the heap
DEFAULT_MMAP_MAX = 65536  # glibc's default number of mapped blocks
SETTLED_MMAP_THRESHOLD = 32 << 20  # the highest mmap threshold glibc's dynamic adjustment reaches (64-bit)
SETTLED_TRIM_THRESHOLD = 2 * SETTLED_MMAP_THRESHOLD  # glibc keeps the trim threshold at twice the mmap one
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
OFF_SWITCH = "PYTEST_AUTOGRAD_KEEP_MALLOC"


@lru_cache(maxsize=None)
def _mallopt():
    """glibc's ``mallopt``, or None where its settings are not ours to change."""
    if os.environ.get(OFF_SWITCH, "") not in ("", "0") or any(name in os.environ for name in USER_SETTINGS):
        return None
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


@lru_cache(maxsize=None)
def _malloc_trim():
    trim = ctypes.CDLL(None).malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_kept = False  # a check kept freed memory in the heap since the last give_back


@contextmanager
def reusing_freed_memory():
    """Every block from the heap, and freed memory kept there, inside; glibc's settled limits after."""
    global _kept
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    _kept = True
    mallopt(M_TRIM_THRESHOLD, KEEP_ALL)
    mallopt(M_MMAP_MAX, 0)
    try:
        yield
    finally:
        mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        mallopt(M_MMAP_THRESHOLD, SETTLED_MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, SETTLED_TRIM_THRESHOLD)


def give_back():
    """Return to the system the free memory the checks kept in the heap: the op's last check is done."""
    global _kept
    if _kept:
        _kept = False
        _malloc_trim()(0)


__all__ = ["give_back", "reusing_freed_memory"]
