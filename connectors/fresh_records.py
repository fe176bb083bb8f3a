"""The records a shard task applies: step 2, which routed rows are fresh, and making them records.

Records whose id is their Kafka position (`injectors/record_ids.py`) are decided by the shard's
offset marks (`state/offset_marks.py`), the rest (and a partition without a mark) by the Bloom
filter, then the catalog (`state/catalog.py`). docs/design.md section 4, step 2. The verdicts
need only each row's id and system time, so no `Record` is built here: an operator that reads
records gets them built per key batch (`KeyRecords`); a lifted built-in aggregation
reads timestamps and values from the rows and never builds one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast, overload

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


def record_id(row: tuple, internal: frozenset[str]) -> tuple[bytes, int]:
    """A row's record id and system time: an internal stream carries the production's in
    headers, an injected one in its columns."""
    rid, system_time = row[ID], row[SYSTEM]
    if row[STREAM] in internal:
        rid = header(row[HEADERS], HEADER_ID) or rid
        system_time = decode_time_header(header(row[HEADERS], HEADER_SYSTEM_TIME)) or system_time
    return rid, system_time


def to_record(item: TaskInput, internal: frozenset[str]) -> Record:
    """The record user code sees: headers without millstream's own (`visible_headers`)."""
    row = item.row
    rid, system_time = record_id(row, internal)
    # Positional, in Record's field order: a third cheaper than keywords, once per record.
    headers = visible_headers(row[HEADERS])
    return Record(
        item.key or "", row[VALUE] or b"", row[TS], rid, system_time, row[STREAM], False,
        headers, item.data,
    )  # fmt: skip


class KeyRecords(Sequence[tuple[Record, tuple]]):
    """A key's fresh records of a shard batch, in arrival order, as the operator's
    `process_key` reads them: (record, routed row) pairs, each record built when first read
    and kept. `timestamps` and `data` read the rows themselves, so an operator that needs no
    more (a lifted built-in aggregation) builds no record; `records` may hold some built
    already (a late record flagged)."""

    __slots__ = ("_internal", "_items", "_records")

    def __init__(
        self,
        items: list[TaskInput],
        internal: frozenset[str],
        records: Mapping[int, Record] | None = None,
    ) -> None:
        self._items = items
        self._internal = internal
        self._records: list[Record | None] = [None] * len(items)
        for index, record in (records or {}).items():
            self._records[index] = record

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> tuple[Record, tuple]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[Record, tuple]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._items)))]
        record = self._records[index]
        item = self._items[index]
        if record is None:
            record = self._records[index] = to_record(item, self._internal)
        return record, item.row

    def __iter__(self) -> Iterator[tuple[Record, tuple]]:
        """Every record built at once (an operator that iterates reads them all)."""
        internal, items = self._internal, self._items
        records: list[Record] = [
            to_record(item, internal) if record is None else record
            for record, item in zip(self._records, items, strict=True)
        ]
        self._records = cast(list[Record | None], records)  # the same list: kept for reads
        return zip(records, [item.row for item in items], strict=True)

    def timestamps(self) -> list[int]:
        """Each record's event time (`Record.timestamp`), read from its row."""
        built = self._records
        return [
            item.row[TS] if record is None else record.timestamp
            for item, record in zip(self._items, built, strict=True)
        ]

    def data(self, index: int) -> Any:
        """The record's value as its stream's format decoded it (`Record.data`), or None."""
        return self._items[index].data

    def value(self, index: int) -> bytes:
        """The record's raw value (`Record.value`)."""
        return self._items[index].row[VALUE] or b""


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


# A fresh record: its routed input, its id and system time, the position it was delivered
# from and its id's digest (what the catalog remembers of it, hashed once for the verdict and
# the write). A record whose id is its Kafka position has neither position nor digest (b""):
# the offset marks remember it.
Fresh = tuple[TaskInput, bytes, int, bytes, bytes]


def dedup(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, items: list[TaskInput]
) -> list[Fresh]:
    """2. The records not applied before: those whose id is their Kafka position by the
    shard's offset marks, the others (and those of a partition without a mark) by the Bloom
    filter, then the catalog."""
    internal = plan.internal_inputs
    if internal:
        ids = [record_id(i.row, internal) for i in items]
    else:  # injected streams only: the columns hold them
        ids = [(i.row[ID], i.row[SYSTEM]) for i in items]
    if not spec.options.exactly_once:
        # No dedup at all (docs/design.md section 4, step 2): no mark moved, no catalog entry.
        return [(i, rid, t, b"", b"") for i, (rid, t) in zip(items, ids, strict=True)]
    verdicts: list[Verdict | None] = [None] * len(items)
    runs = offset_runs(items, ids)
    if runs:
        found = store.dedup_by_offset([run for _, run in runs], plan.gc_watermark)
        indexes = [i for run_indexes, _ in runs for i in run_indexes]
        for index, verdict in zip(indexes, found, strict=True):
            if verdict is not None:
                verdicts[index] = verdict
    rest = [i for i, v in enumerate(verdicts) if v is None]
    positions = [b""] * len(items)
    digests = [b""] * len(items)
    for index in rest:
        positions[index] = _position(items[index].row)
        digests[index] = id_digest(ids[index][0])
    if rest:
        looked_up = store.dedup(
            [(ids[i][0], ids[i][1], positions[i]) for i in rest],
            plan.gc_watermark,
            [digests[i] for i in rest],
        )
        for index, verdict in zip(rest, looked_up, strict=True):
            verdicts[index] = verdict
    new = Verdict.NEW
    return [
        (i, rid, t, p, d)
        for i, (rid, t), p, d, v in zip(items, ids, positions, digests, verdicts, strict=True)
        if v is None or v is new
    ]


def offset_runs(
    items: list[TaskInput], ids: list[tuple[bytes, int]]
) -> list[tuple[list[int], Run]]:
    """The records whose ids are their Kafka position (`record_ids.is_position`), one run per
    stream and partition in offset order, with their indexes in `items`. `ids`: each item's
    (record id, system time)."""
    by_partition: dict[tuple[Any, Any, Any], tuple[bytes | None, list[int], Run]] = {}
    for index, (item, (rid, system_time)) in enumerate(zip(items, ids, strict=True)):
        row = item.row
        where = (row[STREAM], row[SOURCE], row[PARTITION])
        entry = by_partition.get(where)
        if entry is None:
            prefix = partition_prefix(row[SOURCE], row[PARTITION])
            entry = by_partition[where] = (prefix, [], (prefix or b"", [], [], []))
        prefix = entry[0]
        if prefix is None or not is_position(rid, prefix, row[OFFSET]):
            continue
        entry[1].append(index)
        _, offsets, keys, times = entry[2]
        offsets.append(row[OFFSET])
        # the key routing placed it by (`routing.route`; a row without one by its id), which
        # a mark inherited from a rescale is qualified by
        keys.append(item.key if item.key is not None else rid.hex())
        times.append(system_time)
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
