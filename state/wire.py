"""Byte encoding of checkpointed productions."""

from __future__ import annotations

from millstream.records import Production
from millstream.state import _codec


def _int(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def encode_production(p: Production) -> bytes:
    headers = _codec.pack([part for k, v in p.headers for part in (k.encode(), v)])
    return _codec.pack(
        [
            p.stream.encode(),
            p.key.encode(),
            p.value,
            _int(p.timestamp),
            p.id,
            _int(p.system_time),
            _int(p.seq),
            headers,
        ]
    )


def decode_production(blob: bytes) -> Production:
    stream, key, value, ts, pid, system_time, seq, headers = _codec.unpack(blob)
    flat = _codec.unpack(headers)
    pairs = tuple((flat[i].decode(), flat[i + 1]) for i in range(0, len(flat), 2))
    return Production(
        stream=stream.decode(),
        key=key.decode(),
        value=value,
        timestamp=int.from_bytes(ts, "big", signed=True),
        id=pid,
        system_time=int.from_bytes(system_time, "big", signed=True),
        seq=int.from_bytes(seq, "big", signed=True),
        headers=pairs,
    )
