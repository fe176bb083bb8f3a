"""The log-file injector's view of its directory: which files are there, under which identity,
and which of them is another's copy (logrotate's copytruncate) or a rotated name of a file the
pattern picks up. Pure questions to the file system; the planner decides what to follow.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from millstream.injectors._logfile_lines import FINGERPRINT_BYTES, fingerprint_matches, same_bytes

Inode = tuple[int, int]
Head = tuple[int, int]  # (n, crc32 of the first n bytes): `head_fingerprint`


# --- listing -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file in the watched directory, as stat() saw it."""

    name: str
    dev: int
    ino: int
    size: int
    mtime_ms: int
    matched: bool  # its name matches the pattern (only matched files are picked up)


def scan_directory(directory: str, pattern: str) -> dict[tuple[int, int], Entry]:
    """Regular files in `directory` by inode; a file under two names is listed once.

    Every file is listed, not only matching ones, because a tracked file keeps being followed
    after rotation renames it to a name the pattern no longer matches.
    """
    out: dict[tuple[int, int], Entry] = {}
    for name in sorted(os.listdir(directory)):
        try:
            st = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # deleted between listing and stat
        if not stat.S_ISREG(st.st_mode):
            continue
        entry = Entry(
            name,
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns // 1_000_000,
            fnmatch.fnmatchcase(name, pattern),
        )
        known = out.get((entry.dev, entry.ino))
        if known is None or (entry.matched and not known.matched):
            out[(entry.dev, entry.ino)] = entry
    return out


# Rotated names ending so are compressed copies (logrotate's `compress`), not lines to read.
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".Z")


def rotated_name(name: str, pattern: str) -> bool:
    """`name` is a name logrotate gives a file matching `pattern` when it rotates it
    (`app.log.1`, `app.log-20261127`), and not a compressed one."""
    if name.endswith(COMPRESSED):
        return False
    for cut in range(len(name) - 1, 0, -1):
        if name[cut] in ".-" and fnmatch.fnmatchcase(name[:cut], pattern):
            return True
    return False


def open_verified(directory: str, name: str, inode: tuple[int, int]) -> BinaryIO | None:
    """Open `name` if it still is the file with `inode` (it may have been renamed since)."""
    try:
        fh = open(os.path.join(directory, name), "rb")  # noqa: SIM115 - returned to the caller
    except OSError:
        return None
    st = os.fstat(fh.fileno())
    if (st.st_dev, st.st_ino) != inode:
        fh.close()
        return None
    return fh


# --- copytruncate --------------------------------------------------------------------------------
def copy_of(
    directory: str, head: Head, entries: dict[Inode, Entry], claimed: set[Inode]
) -> tuple[Entry, BinaryIO] | None:
    """A file no one follows (`claimed`) that starts with `head`: the copy holding a truncated
    file's bytes, made after we read (it has more) or before (it has a prefix). Open, or None."""
    if head[0] == 0:
        return None
    for inode, entry in sorted(entries.items(), key=lambda item: item[1].name):
        if inode in claimed or entry.size < head[0]:
            continue
        fh = open_verified(directory, entry.name, inode)
        if fh is None:
            continue
        if fingerprint_matches(fh, head):
            return entry, fh
        fh.close()
    return None


def is_copy(
    directory: str,
    entry: Entry,
    fh: BinaryIO,
    followed: Sequence[tuple[Inode, Head]],
    entries: dict[Inode, Entry],
) -> bool:
    """A new file that is a byte copy of a followed one's beginning (copytruncate's copy, made
    before the original is truncated): its head and its last bytes match the followed file's at
    the same offsets. The original's truncation then hands it over (`copy_of`); until that,
    picking it up would read those bytes twice under new ids."""
    for inode, head in followed:
        original = entries.get(inode)
        if original is None or not 0 < head[0] <= entry.size <= original.size:
            continue
        if not fingerprint_matches(fh, head):
            continue
        other = open_verified(directory, original.name, inode)
        if other is None:
            continue
        with other:
            return same_bytes(fh, other, max(0, entry.size - FINGERPRINT_BYTES), entry.size)
    return False
