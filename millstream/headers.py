"""The Kafka headers millstream writes on every production: its wire format for readers.

The sinks write them and the runtime reads them back when a computation consumes a stream, so
both layers share this module; consumers outside millstream may rely on it too:

- `ms-id`: the production id, raw bytes, stable across re-deliveries (deduplicate by it).
- `ms-system-time`, `ms-event-time`: milliseconds as a big-endian signed 64-bit integer
  (8 bytes). `decode_time_header` also accepts ASCII decimal, which older writers used.
- the production's own headers follow, in order (`ctx.produce(..., headers=)`): names that do
  not start with `ms-`, which is kept for millstream's own.

Computations see a record's headers without the `ms-` ones (`Record.headers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from millstream.records import Production

__all__ = [
    "HEADER_EVENT_TIME",
    "HEADER_ID",
    "HEADER_SYSTEM_TIME",
    "RESERVED_PREFIX",
    "decode_time_header",
    "encode_time",
    "production_headers",
    "user_headers",
    "visible_headers",
]

HEADER_ID = "ms-id"
HEADER_SYSTEM_TIME = "ms-system-time"
HEADER_EVENT_TIME = "ms-event-time"
RESERVED_PREFIX = "ms-"  # header names millstream writes and reads; user code never sees them


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


def user_headers(
    headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None,
) -> tuple[tuple[str, bytes], ...]:
    """Headers given to `ctx.produce`, checked: str names not starting with `ms-` (a user
    `ms-id` would be taken for the production id), values bytes or str (encoded UTF-8)."""
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[tuple[str, bytes]] = []
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise TypeError(f"headers: expected (name, value) pairs, got {item!r}") from None
        if not isinstance(name, str) or not name:
            raise TypeError(f"header name must be a non-empty str, got {name!r}")
        if name.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"header {name!r}: names starting with {RESERVED_PREFIX!r} are millstream's own "
                f"(production id and times); rename it"
            )
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, bytearray | memoryview):
            value = bytes(value)
        elif not isinstance(value, bytes):
            raise TypeError(
                f"header {name!r}: value must be bytes or str, got {type(value).__name__}"
            )
        out.append((name, value))
    return tuple(out)


def visible_headers(raw: Iterable[Any] | None) -> tuple[tuple[str, bytes], ...]:
    """A record's headers as user code sees them (`Record.headers`): in arrival order, without
    the `ms-` ones; a null Kafka header value reads as b""."""
    if not raw:
        return ()
    out = []
    for name, value in raw:
        name = name if type(name) is str else str(name)
        if name.startswith(RESERVED_PREFIX):
            continue
        out.append(
            (name, value if type(value) is bytes else b"" if value is None else bytes(value))
        )
    return tuple(out)
