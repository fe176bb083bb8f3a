"""Routing: each input row's key by its stream's extractor, and the key's shard.

Computed once per row on the driver (the fused runtime), and by TopologyTestDriver the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from millstream.connectors.formats import FieldExtractor, FormatError, ValueFormat, decode_with
from millstream.connectors.fresh_records import format_error
from millstream.connectors.key_runner import ERROR, ID, KEY, STREAM, VALUE
from millstream.connectors.plan import TaskInput, shard_of

if TYPE_CHECKING:
    from millstream.connectors.stage_plan import Stage


def route(
    extractors: dict[str, Any],
    shards: int,
    rows: Iterator[Any],
    formats: Mapping[str, ValueFormat] | None = None,
) -> Iterator[tuple[int, TaskInput]]:
    """Map side: extract each row's key with its stream's extractor; errors travel with the row.

    A stream with a value format (`formats`) has its value decoded here, once: the data
    travels with the row to the shard task, and a field extractor of the same format reads
    it instead of decoding again. A value that does not decode is an error row.
    """
    for row in rows:
        values = row if type(row) is tuple else tuple(row)
        if values[ERROR] is not None:
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, values[ERROR])
            continue
        value = values[VALUE] or b""
        fmt = formats.get(values[STREAM]) if formats else None
        data: Any = None
        extract = extractors[values[STREAM]]
        try:
            if fmt is not None:
                data = decode_with(fmt, value)
            if fmt is not None and isinstance(extract, FieldExtractor) and extract.format == fmt:
                key = extract.from_data(data)
            else:
                key = extract(values[KEY], value)
            if not isinstance(key, str):
                raise TypeError(f"key extractor returned {type(key).__name__}, expected str")
        except FormatError as exc:
            reason = format_error(values, exc)
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, reason)
        except Exception as exc:
            reason = f"key extraction failed: {type(exc).__name__}: {exc}"
            yield shard_of(values[ID].hex(), shards), TaskInput(None, values, reason)
        else:
            item = TaskInput(key, values, None, data, decoded=fmt is not None)
            yield shard_of(key, shards), item


def route_stage(
    stage: Stage,
    by_stream: Mapping[str, list[tuple]],
    handed: Mapping[str, list[tuple]],
    replayed: Sequence[tuple] = (),
) -> dict[int, list[TaskInput]]:
    """A computation's part of a batch by shard: its injected rows (`by_stream`), the
    productions handed to it in this batch (`handed`) and its replayed dead letters, each
    row's shard under its key extractors, computed once."""
    extractors = dict(stage.spec.inputs)
    rows = [row for s in extractors for row in (*by_stream.get(s, ()), *handed.get(s, ()))]
    rows += replayed
    inputs: dict[int, list[TaskInput]] = {}
    for shard, item in route(extractors, stage.shards, iter(rows), stage.spec.formats):
        inputs.setdefault(shard, []).append(item)
    return inputs
