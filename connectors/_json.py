"""JSON for the hot path (state serde, JSON value formats, production values): the standard
library's answers, several times faster.

Every record of a JSON stream is decoded where it is routed, and a JSON state is decoded and
encoded once per call of user code: with the standard library that was about a fifth of a
shard's work per record. msgspec decodes (strict RFC 8259, integers of any size exactly) and
orjson encodes; whatever either would answer differently from `json` goes to `json` itself:

- decoding: what msgspec refuses (NaN and Infinity, byte-order marks and UTF-16/32, lone
  surrogates, numbers out of a float's range) is decoded, or refused, by `json.loads`;
- encoding: orjson refuses non-str dict keys and integers beyond 64 bits, and is told to refuse
  dataclasses, datetimes and subclasses of builtins: `json.dumps` encodes those (or raises
  TypeError, as it always did). orjson writes NaN and Infinity as null: an output with a null
  in it is encoded again by `json.dumps`, which keeps them.

Left different: orjson writes non-ASCII characters as UTF-8 where `json` escaped them (both are
the same JSON), and encodes `uuid.UUID` and `enum.Enum` members (as their string and value)
where `json` raised TypeError.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson

_DECODER = msgspec.json.Decoder()
_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def loads(data: bytes | str) -> Any:
    """`json.loads(data)`."""
    try:
        return _DECODER.decode(data)
    except (msgspec.MsgspecError, TypeError):
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON with sorted keys, as `json.dumps(value, separators=(",", ":"),
    sort_keys=True)` gives it, in bytes."""
    try:
        out = orjson.dumps(value, option=_OPTIONS)
    except TypeError:
        return _std_dumps(value)
    if b"null" in out:  # maybe a NaN or an Infinity orjson wrote as null
        return _std_dumps(value)
    return out


def _std_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
