"""While an op's checks run on a large sample, its tensors reuse memory freed by earlier ones instead of fresh pages.

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
one fault it all in again: the battery took 1.6 times as long on a GELU of
1M elements.

Only checks on the CPU with a large sample (a strided tensor of 2**20
elements or more, 8 MiB in float64) do this: from there an op's float64
intermediates pass glibc's 32 MiB cap (attention's scores at 2**20 elements
per argument are 64 MiB). A process checking only smaller ops, or only on a
GPU, keeps glibc's own dynamic limits, which any ``mallopt`` call turns off
for good. Nothing changes where the C library is not glibc, where another
allocator (jemalloc, tcmalloc) is preloaded, or where the user chose glibc's
malloc settings (``MALLOC_MMAP_MAX_``, ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``glibc.malloc.*`` in
``GLIBC_TUNABLES``): those are theirs. ``PYTEST_AUTOGRAD_MALLOPT=0`` (or
``false``, ``no``, ``off``) turns this off. Threads other than the main one
are not helped: glibc maps their large blocks whatever its settings say.
The cost is memory: the heap holds freed blocks a later, differently sized
one cannot use, so an op's checks peak at 1.5x to 2x the memory.
"""

import ctypes
import os
from contextlib import contextmanager
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt's parameters (malloc.h)
LARGE_SAMPLE = 1 << 20  # elements of a sample tensor from which the checks on it reuse freed memory
KEEP_ALL = 2**31 - 1  # the largest trim threshold mallopt takes: freed memory stays in the heap
DEFAULT_MMAP_MAX = 65536  # glibc's default number of mapped blocks
SETTLED_MMAP_THRESHOLD = 32 << 20  # the highest mmap threshold glibc's dynamic adjustment reaches (64-bit)
SETTLED_TRIM_THRESHOLD = 2 * SETTLED_MMAP_THRESHOLD  # glibc keeps the trim threshold at twice the mmap one
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
SWITCH = "PYTEST_AUTOGRAD_MALLOPT"  # 0 (or false, no, off): glibc's settings are never changed


@lru_cache(maxsize=None)
def _glibc():
    """The process's glibc (``mallopt`` and ``malloc_trim`` set up), or None where its settings are not ours to
    change."""
    if os.environ.get(SWITCH, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    if not _glibc_version().startswith("glibc"):
        return None
    try:
        process, libc = ctypes.CDLL(None), ctypes.CDLL("libc.so.6")
        if ctypes.cast(process.malloc, ctypes.c_void_p).value != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
            return None  # another allocator is preloaded: glibc's settings would not reach it
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _glibc_version():
    """"glibc 2.36" where the C library is glibc; "" elsewhere (musl, macOS, Windows)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return ""


_kept_by = None  # the glibc whose heap a check kept freed memory in since the last give_back


@contextmanager
def reusing_freed_memory(largest_numel):
    """Inside: every block from the heap and freed memory kept there, when ``largest_numel`` (the elements of the
    largest CPU sample tensor) is large. After: glibc's settled limits."""
    global _kept_by
    libc = _glibc() if largest_numel >= LARGE_SAMPLE else None
    if libc is None:
        yield
        return
    try:
        _kept_by = libc
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_ALL)
        libc.mallopt(M_MMAP_MAX, 0)
        yield
    finally:
        _settle(libc)


def _settle(libc):
    """glibc's limits where its own dynamic ones settle in a process that frees large tensors."""
    libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
    libc.mallopt(M_MMAP_THRESHOLD, SETTLED_MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, SETTLED_TRIM_THRESHOLD)


def give_back():
    """Return to the system the free memory the checks kept in the heap: the op's last check is done."""
    global _kept_by
    libc, _kept_by = _kept_by, None
    if libc is not None:
        _settle(libc)  # again: a check interrupted while it set them may have left them unsettled
        libc.malloc_trim(0)


__all__ = ["LARGE_SAMPLE", "give_back", "reusing_freed_memory"]
