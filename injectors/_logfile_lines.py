"""Byte-level line handling for the log-file injector: pure functions over open binary files.

Every position here is a byte offset into one file. A line is the bytes between two newlines; a
line is *complete* only once its newline is on disk, so a writer caught mid-line is never read
(its partial line is held back until the newline arrives). Offsets kept in Spark's checkpoint
always sit at line starts, which is what makes a replayed range yield the same lines.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import BinaryIO

NEWLINE = b"\n"
BLOCK = 1 << 20  # read size on executors
PROBE = 1 << 16  # read size on the driver, which only looks for newlines
FINGERPRINT_BYTES = 64  # head bytes that tell one file from a later file reusing its inode


class TruncatedError(Exception):
    """The file ended before a range the driver planned: it was truncated or replaced."""

    def __init__(self, position: int) -> None:
        super().__init__(f"file ends at byte {position}, before the planned range")
        self.position = position


# --- record ids -----------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"varint of negative {value}")
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def record_id(dev: int, ino: int, born: int, offset: int) -> bytes:
    """Stable id of the line at `offset`: b"f" + LEB128 varints of (dev, ino, born, offset).

    Varints are prefix-free, so the concatenation is unique and typically 15-20 bytes; `born`
    (when the file was first seen) keeps ids apart when the filesystem reuses an inode.
    """
    return b"f" + _varint(dev) + _varint(ino) + _varint(born) + _varint(offset)


# --- pure splitting ---------------------------------------------------------------------------
def split_complete(data: bytes, base: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    """Split `data` (which starts at a line start, file offset `base`) into complete lines.

    Returns [(offset, line without its newline)] and the offset just past the last newline;
    bytes after it are a partial line held back until its newline arrives.
    """
    lines: list[tuple[int, bytes]] = []
    start = 0
    while True:
        nl = data.find(NEWLINE, start)
        if nl < 0:
            return lines, base + start
        lines.append((base + start, data[start:nl]))
        start = nl + 1


def strip_cr(line: bytes) -> bytes:
    """Drop the carriage return of a CRLF line: the record is the same on either platform."""
    return line[:-1] if line.endswith(b"\r") else line


# --- executors: reading a planned range --------------------------------------------------------
def iter_lines(
    fh: BinaryIO,
    start: int,
    stop: int,
    limit: int,
    *,
    owns_first: bool,
    block: int = BLOCK,
) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, line) for every line that *starts* in [start, stop).

    A range may be split into chunks at arbitrary bytes (Hadoop's rule): a chunk owns the lines
    that start inside it, finishes its last line past `stop` (never past `limit`, the planned end,
    which is a line boundary), and when `owns_first` is false skips the line straddling `start`
    because the previous chunk owns it.
    """
    pos = start
    if not owns_first:
        # The line containing byte start-1 belongs to the previous chunk; ours begin after it.
        pos = start - 1
        fh.seek(pos)
        while True:
            data = fh.read(min(block, limit - pos))
            if not data:
                raise TruncatedError(pos)
            nl = data.find(NEWLINE)
            if nl >= 0:
                buf, base = data[nl + 1 :], pos + nl + 1
                break
            pos += len(data)
    else:
        fh.seek(start)
        buf, base = b"", start
    idx = 0  # start of the current line within buf
    search = 0  # where to look for its newline (bytes before it were already searched)
    while base + idx < stop:
        nl = buf.find(NEWLINE, search)
        if nl < 0:
            want = min(block, limit - (base + len(buf)))
            more = fh.read(want) if want > 0 else b""
            if not more:
                raise TruncatedError(base + len(buf))
            buf, base, search, idx = buf[idx:] + more, base + idx, len(buf) - idx, 0
            continue
        yield base + idx, buf[idx:nl]
        idx = search = nl + 1


# --- driver: finding line boundaries -----------------------------------------------------------
def last_line_end(fh: BinaryIO, lo: int, hi: int, block: int = PROBE) -> int:
    """Offset just past the last newline in [lo, hi), or lo if there is none (reads backwards)."""
    pos = hi
    while pos > lo:
        size = min(block, pos - lo)
        fh.seek(pos - size)
        data = fh.read(size)
        nl = data.rfind(NEWLINE)
        if nl >= 0:
            return pos - size + nl + 1
        pos -= size
    return lo


def advance_lines(
    fh: BinaryIO, lo: int, hi: int, max_lines: int, block: int = PROBE
) -> tuple[int, int]:
    """Move past at most `max_lines` complete lines from `lo` (a line start), not beyond `hi`.

    Returns (new offset, lines passed). Reading forward is bounded by the lines admitted.
    """
    pos, count, end = lo, 0, lo
    fh.seek(lo)
    while count < max_lines and pos < hi:
        data = fh.read(min(block, hi - pos))
        if not data:
            break
        start = 0
        while count < max_lines:
            nl = data.find(NEWLINE, start)
            if nl < 0:
                break
            count += 1
            start = nl + 1
            end = pos + start
        pos += len(data)
    return end, count


def advance_bytes(fh: BinaryIO, lo: int, hi: int, max_bytes: int, *, at_least_one: bool) -> int:
    """Move past whole lines from `lo` totalling at most `max_bytes`, not beyond `hi`.

    With `at_least_one`, a first line longer than the budget is still admitted so a batch can
    always make progress.
    """
    end = last_line_end(fh, lo, min(hi, lo + max_bytes))
    if end == lo and at_least_one:
        end, _ = advance_lines(fh, lo, hi, 1)
    return end


# --- fingerprints --------------------------------------------------------------------------------
def head_fingerprint(fh: BinaryIO, size: int) -> tuple[int, int]:
    """(n, crc32 of the first n bytes), n = min(size, FINGERPRINT_BYTES).

    An appended-to log never rewrites its head, so a changed head means a different file now
    holds this inode (deleted and reused) or the file was truncated and rewritten.
    """
    n = min(size, FINGERPRINT_BYTES)
    fh.seek(0)
    head = fh.read(n)
    return len(head), zlib.crc32(head)


def fingerprint_matches(fh: BinaryIO, expected: tuple[int, int]) -> bool:
    n, crc = expected
    fh.seek(0)
    head = fh.read(n)
    return len(head) == n and zlib.crc32(head) == crc


def same_bytes(a: BinaryIO, b: BinaryIO, start: int, stop: int) -> bool:
    """Whether two files hold the same bytes in [start, stop)."""
    a.seek(start)
    b.seek(start)
    want = stop - start
    return len(left := a.read(want)) == want and left == b.read(want)
