"""The Kafka headers millstream writes on every production: its wire format for readers.

The sinks write them and the runtime reads them back when a computation consumes a stream, so
both layers share this module; consumers outside millstream may rely on it too:

- `ms-id`: the production id, raw bytes, stable across re-deliveries (deduplicate by it).
- `ms-system-time`, `ms-event-time`: milliseconds as a big-endian signed 64-bit integer
  (8 bytes). `decode_time_header` also accepts ASCII decimal, which older writers used.
- the production's own headers follow, in order.
"""

from __future__ import annotations

from millstream.records import Production

__all__ = [
    "HEADER_EVENT_TIME",
    "HEADER_ID",
    "HEADER_SYSTEM_TIME",
    "decode_time_header",
    "encode_time",
    "production_headers",
]

HEADER_ID = "ms-id"
HEADER_SYSTEM_TIME = "ms-system-time"
HEADER_EVENT_TIME = "ms-event-time"


def encode_time(ms: int) -> bytes:
    """A millisecond time as an 8-byte big-endian signed integer: fixed size, sorts bytewise."""
    return int(ms).to_bytes(8, "big", signed=True)


def decode_time_header(raw: bytes | None) -> int | None:
    """Read `ms-system-time` / `ms-event-time`: 8-byte big-endian, or ASCII decimal."""
    if raw is None:
        return None
    if len(raw) == 8:
        return int.from_bytes(raw, "big", signed=True)
    return int(raw.decode("ascii"))


def production_headers(production: Production) -> list[tuple[str, str | bytes | None]]:
    """The millstream headers first, then the production's own, in order.

    Typed as confluent-kafka's `Producer.produce(headers=...)` takes them.
    """
    return [
        (HEADER_ID, production.id),
        (HEADER_SYSTEM_TIME, encode_time(production.system_time)),
        (HEADER_EVENT_TIME, encode_time(production.timestamp)),
        *production.headers,
    ]
