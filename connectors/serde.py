"""State serdes: how a key's state value becomes bytes in Redis and back."""

from __future__ import annotations

import pickle
from typing import Any, Protocol

from millstream.connectors import _json


class Serde(Protocol):
    name: str

    def dumps(self, value: Any) -> bytes: ...
    def loads(self, data: bytes) -> Any: ...


class JsonSerde:
    """The default: readable in redis-cli, safe to load."""

    name = "json"

    def dumps(self, value: Any) -> bytes:
        return _json.dumps(value)

    def loads(self, data: bytes) -> Any:
        return _json.loads(data)


class BytesSerde:
    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"bytes serde stores bytes, got {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return data


class PickleSerde:
    """Opt-in: any Python object, but only for state written by code you trust."""

    name = "pickle"

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


SERDES: dict[str, type[Serde]] = {"json": JsonSerde, "bytes": BytesSerde, "pickle": PickleSerde}


def serde_named(name: str) -> Serde:
    try:
        return SERDES[name]()
    except KeyError:
        raise ValueError(f"unknown state serde {name!r}: use one of {sorted(SERDES)}") from None


def encode_value(value: bytes | str | Any) -> bytes:
    """Production values: bytes as-is, str as UTF-8, anything else as compact JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return _json.dumps(value)
