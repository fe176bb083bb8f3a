"""Value formats: how a stream's value bytes become `Record.data`, and productions' values bytes.

A stream declared with a format (`Topology.source(..., value_format=)`,
`Topology.stream_format`) has each record's value decoded once, where the runtime routes it,
into `record.data`; `record.value` stays the raw bytes. A value that does not decode is bad
input: dead-lettered with the stream, the format and its position, never dropped. Values
given to `ctx.produce` for such a stream are encoded with it (bytes are taken as already
encoded), and one that does not encode fails the call (the user-error path).
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from millstream.connectors import _json

__all__ = [
    "AvroFormat",
    "FieldExtractor",
    "FormatError",
    "JsonFormat",
    "ValueFormat",
    "avro_format",
    "decode_with",
    "encode_with",
    "json_format",
]


class FormatError(ValueError):
    """A value that does not decode, or data that does not encode, with a stream's format."""


class ValueFormat(ABC):
    """How values of a stream are encoded. Subclass it for other encodings (Protobuf, ...);
    instances are shipped to Spark executors, so they must pickle."""

    @abstractmethod
    def decode(self, value: bytes) -> Any:
        """The value's data; raises on a value that is not in this format."""

    @abstractmethod
    def encode(self, data: Any) -> bytes:
        """`data` as value bytes; raises on data this format cannot hold."""

    def describe(self) -> str:
        """How dead letters and errors name this format."""
        return type(self).__name__

    def field(self, name: str) -> FieldExtractor:
        """A key extractor: the string of field `name` of the decoded value."""
        return FieldExtractor(self, name)


@dataclass(frozen=True)
class JsonFormat(ValueFormat):
    """UTF-8 JSON. Encodes compact, keys sorted, non-ASCII characters as UTF-8 (as plain
    `ctx.produce` encodes a dict)."""

    def decode(self, value: bytes) -> Any:
        return _json.loads(value)

    def encode(self, data: Any) -> bytes:
        return _json.dumps(data)

    def describe(self) -> str:
        return "json"


class AvroFormat(ValueFormat):
    """Avro binary without a container or registry framing (fastavro's schemaless reader and
    writer): the schema is given in code, and writer and readers must agree on it."""

    def __init__(self, schema: dict[str, Any] | list[Any] | str) -> None:
        from fastavro import parse_schema
        from fastavro.schema import SchemaParseException, UnknownType

        try:
            self._parsed = parse_schema(schema)
        except (SchemaParseException, UnknownType, TypeError, ValueError) as exc:
            raise ValueError(f"invalid Avro schema: {type(exc).__name__}: {exc}") from None
        self.schema = schema

    def decode(self, value: bytes) -> Any:
        from fastavro import schemaless_reader

        buffer = io.BytesIO(value)
        data = schemaless_reader(buffer, self._parsed, None)
        left = len(value) - buffer.tell()
        if left:
            # The schema read a whole record and bytes remain: written with another schema.
            raise ValueError(f"{left} bytes left over after the record ({len(value)} in all)")
        return data

    def encode(self, data: Any) -> bytes:
        from fastavro import schemaless_writer

        buffer = io.BytesIO()
        # strict: a missing field (without a default) or an extra one is an error, not a
        # silently dropped or defaulted value.
        schemaless_writer(buffer, self._parsed, data, strict_allow_default=True)
        return buffer.getvalue()

    def describe(self) -> str:
        name = self.schema.get("name") if isinstance(self.schema, dict) else None
        return f"avro (schema {name!r})" if name else "avro"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AvroFormat) and other._parsed == self._parsed

    def __hash__(self) -> int:
        return hash(json.dumps(self._parsed, sort_keys=True, default=str))

    def __repr__(self) -> str:
        return f"avro_format({self.schema!r})"


@dataclass(frozen=True)
class FieldExtractor:
    """A key extractor reading one field of a value in `format`. Called on the value bytes it
    decodes them itself; where the runtime already decoded the value with the same format it
    reads that data instead (`from_data`), so a record is decoded once."""

    format: ValueFormat
    name: str

    def __call__(self, key: bytes | None, value: bytes) -> str:
        return self.from_data(self.format.decode(value))

    def from_data(self, data: Any) -> str:
        return str(data[self.name])


def json_format() -> JsonFormat:
    """UTF-8 JSON values: `record.data` is the parsed value; produce dicts, lists, str, ..."""
    return JsonFormat()


def avro_format(schema: dict[str, Any] | list[Any] | str) -> AvroFormat:
    """Avro binary values with this schema (as fastavro parses it); raises ValueError for an
    invalid schema, at declaration."""
    return AvroFormat(schema)


def decode_with(fmt: ValueFormat, value: bytes) -> Any:
    """`fmt.decode(value)`, any failure raised as FormatError naming the format."""
    try:
        return fmt.decode(value)
    except Exception as exc:
        raise FormatError(
            f"does not decode as {fmt.describe()}: {type(exc).__name__}: {exc}"
        ) from exc


def encode_with(fmt: ValueFormat, data: Any) -> bytes:
    """Bytes as they are (already encoded, e.g. a record's raw value passed on); anything
    else by `fmt.encode`, any failure raised as FormatError naming the format."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    try:
        encoded = fmt.encode(data)
    except Exception as exc:
        raise FormatError(
            f"does not encode as {fmt.describe()}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(encoded, bytes):
        raise FormatError(f"{fmt.describe()} encoded to {type(encoded).__name__}, not bytes")
    return encoded
