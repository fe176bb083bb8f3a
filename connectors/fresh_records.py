"""The records a shard task applies: routed rows made records, and step 2, which are fresh.

Records whose id is their Kafka position (`injectors/record_ids.py`) are decided by the shard's
offset marks (`state/offset_marks.py`), the rest (and a partition without a mark) by the Bloom
filter, then the catalog (`state/catalog.py`). docs/design.md section 4, step 2.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from millstream.connectors.formats import FormatError, ValueFormat, decode_with
from millstream.connectors.key_runner import (
    HEADERS,
    ID,
    OFFSET,
    PARTITION,
    SOURCE,
    STREAM,
    SYSTEM,
    TS,
    VALUE,
)
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.topology import ComputationSpec
from millstream.headers import HEADER_ID, HEADER_SYSTEM_TIME, decode_time_header, visible_headers
from millstream.injectors.record_ids import is_position, partition_prefix
from millstream.records import Record
from millstream.state.catalog import Verdict
from millstream.state.catalog_entries import digest as id_digest
from millstream.state.offset_marks import Run
from millstream.state.shard import ShardStore


def header(headers: Iterable[Any] | None, name: str) -> bytes | None:
    for item in headers or ():
        if item[0] == name:
            return item[1]
    return None


def to_record(item: TaskInput, internal: frozenset[str]) -> Record:
    """Internal streams carry the production's id and system time in headers; user code sees
    the other headers only (`visible_headers`)."""
    row = item.row
    rid, system_time = row[ID], row[SYSTEM]
    if row[STREAM] in internal:
        rid = header(row[HEADERS], HEADER_ID) or rid
        system_time = decode_time_header(header(row[HEADERS], HEADER_SYSTEM_TIME)) or system_time
    # Positional, in Record's field order: a third cheaper than keywords, once per record.
    headers = visible_headers(row[HEADERS])
    return Record(
        item.key or "", row[VALUE] or b"", row[TS], rid, system_time, row[STREAM], False,
        headers, item.data,
    )  # fmt: skip


def format_error(row: tuple, exc: FormatError) -> str:
    """A dead letter's reason for a value its stream's format cannot read: stream, position
    (topic or producer, partition or shard, offset or seq), format and cause."""
    return (
        f"value of stream {row[STREAM]!r} at {row[SOURCE]} partition {row[PARTITION]} "
        f"offset {row[OFFSET]} {exc}"
    )


def decode_inputs(items: list[TaskInput], formats: Mapping[str, ValueFormat]) -> list[TaskInput]:
    """Decode the values routing left undecoded (a router not given the formats); a value
    that does not decode becomes an error item, dead-lettered like any bad input."""
    if not formats:
        return items
    out: list[TaskInput] = []
    for item in items:
        fmt = formats.get(item.row[STREAM])
        if fmt is None or item.decoded or item.error is not None:
            out.append(item)
            continue
        try:
            data = decode_with(fmt, item.row[VALUE] or b"")
        except FormatError as exc:
            out.append(dataclasses.replace(item, error=format_error(item.row, exc)))
        else:
            out.append(dataclasses.replace(item, data=data, decoded=True))
    return out


def _position(row: tuple) -> bytes:
    """Where a delivery came from: tells a replayed batch from a duplicate the source sent."""
    return f"{row[SOURCE]}:{row[PARTITION]}:{row[OFFSET]}".encode()


# A fresh record: its routed input, the record, the position it was delivered from and its
# id's digest (what the catalog remembers of it, hashed once for the verdict and the write).
# A record whose id is its Kafka position has neither (b""): the offset marks remember it.
Fresh = tuple[TaskInput, Record, bytes, bytes]


def dedup(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, items: list[TaskInput]
) -> list[Fresh]:
    """2. The records not applied before: those whose id is their Kafka position by the
    shard's offset marks, the others (and those of a partition without a mark) by the Bloom
    filter, then the catalog."""
    records = [to_record(i, plan.internal_inputs) for i in items]
    if not spec.options.exactly_once:
        # No dedup at all (docs/design.md section 4, step 2): no mark moved, no catalog entry.
        return [(i, r, b"", b"") for i, r in zip(items, records, strict=True)]
    verdicts: list[Verdict | None] = [None] * len(records)
    runs = offset_runs(items, records)
    if runs:
        found = store.dedup_by_offset([run for _, run in runs], plan.gc_watermark)
        indexes = [i for run_indexes, _ in runs for i in run_indexes]
        for index, verdict in zip(indexes, found, strict=True):
            if verdict is not None:
                verdicts[index] = verdict
    rest = [i for i, v in enumerate(verdicts) if v is None]
    positions = [b""] * len(records)
    digests = [b""] * len(records)
    for index in rest:
        positions[index] = _position(items[index].row)
        digests[index] = id_digest(records[index].id)
    if rest:
        looked_up = store.dedup(
            [(records[i].id, records[i].system_time, positions[i]) for i in rest],
            plan.gc_watermark,
            [digests[i] for i in rest],
        )
        for index, verdict in zip(rest, looked_up, strict=True):
            verdicts[index] = verdict
    new = Verdict.NEW
    return [
        (i, r, p, d)
        for i, r, p, d, v in zip(items, records, positions, digests, verdicts, strict=True)
        if v is None or v is new
    ]


def offset_runs(items: list[TaskInput], records: list[Record]) -> list[tuple[list[int], Run]]:
    """The records whose ids are their Kafka position (`record_ids.is_position`), one run per
    stream and partition in offset order, with their indexes in `items`."""
    by_partition: dict[tuple[Any, Any, Any], tuple[bytes | None, list[int], Run]] = {}
    for index, (item, record) in enumerate(zip(items, records, strict=True)):
        row = item.row
        where = (row[STREAM], row[SOURCE], row[PARTITION])
        entry = by_partition.get(where)
        if entry is None:
            prefix = partition_prefix(row[SOURCE], row[PARTITION])
            entry = by_partition[where] = (prefix, [], (prefix or b"", [], [], []))
        prefix = entry[0]
        if prefix is None or not is_position(record.id, prefix, row[OFFSET]):
            continue
        entry[1].append(index)
        _, offsets, keys, times = entry[2]
        offsets.append(row[OFFSET])
        # the key routing placed it by (`routing.route`; a row without one by its id), which
        # a mark inherited from a rescale is qualified by
        keys.append(item.key if item.key is not None else record.id.hex())
        times.append(record.system_time)
    runs = []
    for _, indexes, run in by_partition.values():
        if not indexes:
            continue
        offsets = run[1]
        if any(a > b for a, b in itertools.pairwise(offsets)):  # not sorted by the caller
            order = sorted(range(len(offsets)), key=offsets.__getitem__)
            indexes = [indexes[o] for o in order]
            run = (run[0], *([column[o] for o in order] for column in run[1:]))  # type: ignore[assignment]
        runs.append((indexes, run))
    return runs
