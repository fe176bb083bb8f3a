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
from typing import Any

ARENAS = 2  # per process: the main thread's and one shared by every other thread
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


@functools.cache
def _glibc() -> Any:
    """glibc through ctypes, or None where the C library is another."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def cap_arenas() -> None:
    """Cap this process's malloc arenas (the driver's: its read and delivery threads would
    each keep one) unless MALLOC_ARENA_MAX is set: a user's choice stands. Only this process:
    exported to the JVM, the cap raised its resident memory (glibc arenas shared by its many
    threads fragment), by about as much as it saved in the driver."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)


def trim() -> None:
    """Return the pages glibc holds free to the operating system (a few ms)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
