"""Line parsers for the log-file injector: bytes of one line -> (key, event time ms, value).

A parser either returns a triple or raises `BadLine` with a reason; the injector turns a bad line
into an error row for the dead-letter path, so a parser never needs to decide to drop anything.
Built in: `jsonl` (one JSON object per line, key and timestamp taken from fields) and `text`
(the line is the value). Users plug in their own with the `parser` option, "module:function".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from millstream.injectors._callables import load_callable

# (key, timestamp ms or None when the line has none, value[, record id]). A parser that knows
# the record's own id (a field the source set) returns it fourth, so a record the source sent
# twice is recognised as one; otherwise the id is the line's position.
Parsed = (
    tuple[bytes | None, int | None, bytes | None]
    | tuple[bytes | None, int | None, bytes | None, bytes | None]
)
# What parse_line returns: a parser's result, checked, always with a fourth item, the content
# id (CONTENT_ID_PREFIX + the parser's id; None when it gave none: the id is the line's position).
Checked = tuple[bytes | None, int | None, bytes | None, bytes | None]
CONTENT_ID_PREFIX = b"i"  # keeps content ids apart from positional ids (b"f" + varints)
Parser = Callable[[bytes], Parsed]

TIMESTAMP_UNITS = ("ms", "s")
_MAX_MS = 2**62  # keeps event times inside Spark's bigint and clear of the watermark sentinels


class BadLine(Exception):
    """The line cannot become a record; the message is the dead-letter reason."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@dataclass(frozen=True, slots=True)
class JsonLinesParser:
    """One JSON object per line; the value is the line itself, byte for byte.

    Timestamps are integers in `unit` ("ms" default). With unit "s", fractional seconds (as
    `time.time()` logs them) are accepted and floored to the millisecond, exactly: numbers are
    parsed as Decimal, never as binary floats. With unit "ms" a fraction is an error, because a
    float in a millisecond field is more often a unit mistake than a sub-millisecond time.
    """

    key_field: str = "key"
    timestamp_field: str = "ts"
    unit: str = "ms"
    id_field: str | None = None

    def __call__(self, line: bytes) -> Parsed:
        try:
            doc = json.loads(line, parse_float=Decimal, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadLine(f"invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise BadLine(f"expected a JSON object per line, got {type(doc).__name__}")
        if self.id_field is None:
            return self._key(doc), self._timestamp(doc), line
        return self._key(doc), self._timestamp(doc), line, self._id(doc)

    def _id(self, doc: dict[str, Any]) -> bytes:
        assert self.id_field is not None
        rid = doc.get(self.id_field)
        if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
            raise BadLine(f"id field {self.id_field!r} must be a non-empty string or an integer")
        return str(rid).encode()

    def _key(self, doc: dict[str, Any]) -> bytes:
        if self.key_field not in doc:
            raise BadLine(f"missing key field {self.key_field!r}")
        key = doc[self.key_field]
        if isinstance(key, str):
            return key.encode()
        if isinstance(key, int) and not isinstance(key, bool):
            return str(key).encode()
        raise BadLine(
            f"key field {self.key_field!r} must be a string or an integer, got {type(key).__name__}"
        )

    def _timestamp(self, doc: dict[str, Any]) -> int | None:
        raw = doc.get(self.timestamp_field)
        if raw is None:
            return None
        name = self.timestamp_field
        if isinstance(raw, bool) or not isinstance(raw, int | Decimal):
            raise BadLine(f"timestamp field {name!r} must be a number, got {type(raw).__name__}")
        if self.unit == "ms":
            if isinstance(raw, Decimal):
                raise BadLine(
                    f"timestamp field {name!r} must be an integer number of milliseconds, got {raw}"
                )
            ms = raw
        else:
            ms = int((Decimal(raw) * 1000).to_integral_value(rounding=ROUND_FLOOR))
        if not -_MAX_MS < ms < _MAX_MS:
            raise BadLine(f"timestamp field {name!r} is out of range: {raw}")
        return ms


def text_parser(line: bytes) -> Parsed:
    """The whole line is the value; no key, and the event time is the injection time."""
    return None, None, line


def load_parser(spec: str) -> Parser:
    """Import a user parser named "package.module:function" (option `parser`)."""
    return load_callable(spec, "parser")  # type: ignore[return-value]


def parse_line(parser: Parser, line: bytes, name: str) -> Checked:
    """Run `parser` and check its result, so a buggy parser yields error rows, not crashes."""
    try:
        result = parser(line)
    except BadLine:
        raise
    except Exception as exc:  # the user's code: any failure is this line's dead-letter reason
        raise BadLine(f"parser {name} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        raise BadLine(
            f"parser {name} must return (key, timestamp_ms, value[, id]), got {result!r:.80}"
        )
    key, ts, value = result[:3]
    rid = result[3] if len(result) == 4 else None
    if rid is not None and (not isinstance(rid, bytes) or not rid):
        raise BadLine(f"parser {name} returned an id that is not non-empty bytes: {rid!r:.40}")
    if key is not None and not isinstance(key, bytes):
        raise BadLine(f"parser {name} returned a key of type {type(key).__name__}; return bytes")
    if value is not None and not isinstance(value, bytes):
        raise BadLine(
            f"parser {name} returned a value of type {type(value).__name__}; return bytes"
        )
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
        raise BadLine(
            f"parser {name} returned a timestamp of type {type(ts).__name__}; "
            "return integer milliseconds or None"
        )
    if ts is not None and not -_MAX_MS < ts < _MAX_MS:
        raise BadLine(f"parser {name} returned an out-of-range timestamp {ts}")
    return key, ts, value, None if rid is None else CONTENT_ID_PREFIX + rid
