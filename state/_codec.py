"""Compact length-prefixed encoding of byte lists (commit log entries, ids)."""

from __future__ import annotations

import struct

_LEN = struct.Struct(">I")


def pack(items: list[bytes]) -> bytes:
    out = bytearray()
    for item in items:
        out += _LEN.pack(len(item))
        out += item
    return bytes(out)


def unpack(blob: bytes) -> list[bytes]:
    items: list[bytes] = []
    pos, end = 0, len(blob)
    while pos < end:
        (size,) = _LEN.unpack_from(blob, pos)
        pos += 4
        items.append(blob[pos : pos + size])
        pos += size
    return items
