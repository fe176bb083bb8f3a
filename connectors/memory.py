"""Giving a batch's memory back: glibc keeps what a batch freed unless told otherwise.

A batch allocates a row's worth of objects per record in the driver (the read, routing, task
payloads) and in each Python worker (the payload unpickled, the shard tasks' records). Once it
is over, Python frees them, but glibc's allocator keeps the freed pages in its heaps, one heap
(arena) per thread that allocated: the driver's read and delivery threads each keep one. The
process's resident memory then stays at its largest batch's, in every process at once.

`trim` (glibc's `malloc_trim`) returns the free pages after each batch (driver) and each shard
task (Python workers); `cap_arenas` caps the driver's arenas. Elsewhere than glibc (macOS,
musl) both are no-ops.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

ARENAS = 2  # per process: the main thread's and one shared by every other thread
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc through ctypes (its two functions typed), or None where the C library is another."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if not (hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt")):
        return None
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def cap_arenas() -> None:
    """Cap the malloc arenas this process creates from now on (the driver's: its read and
    delivery threads, started later, would each keep one) unless the user set the cap
    (MALLOC_ARENA_MAX, or glibc.malloc.arena_max in GLIBC_TUNABLES): their choice stands.
    Only this process: exported to the JVM, the cap raised its resident memory (arenas shared
    by its many threads fragment) by about as much as it saved in the driver."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)


def trim() -> None:
    """Return the pages glibc holds free to the operating system (well under a millisecond
    after a batch: 0.03 ms measured with 150 MB of live rows)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
