"""Executor side of the log-file injector: a planned byte range -> Arrow batches of injected rows.

Everything a slice needs is in the slice, computed from the checkpointed start and end offsets,
so re-reading [start, end) after a failure yields the same rows: same lines (log files are only
appended to), same ids (identity + byte offset) and the same system_time (the end offset's plan
time).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from millstream.injectors._logfile_directory import open_verified
from millstream.injectors._logfile_lines import (
    TruncatedError,
    fingerprint_matches,
    iter_lines,
    record_id,
    strip_cr,
)
from millstream.injectors._logfile_offset import Position, split_key
from millstream.injectors._logfile_parse import BadLine, Parser, parse_line
from millstream.injectors.schema import INJECTED_SCHEMA

ARROW_SCHEMA = to_arrow_schema(INJECTED_SCHEMA, timezone="UTC")
BATCH_ROWS = 4096


@dataclass
class FileSlice(InputPartition):
    """Lines starting in [start, stop) of one file; `limit` is the planned end (a line end)."""

    key: str
    name: str
    fp: tuple[int, int]
    start: int
    stop: int
    limit: int
    owns_first: bool
    system_time: int
    at: tuple[int, int] | None = None  # the copy holding the bytes (copytruncate), if any


@dataclass
class LostSlice(InputPartition):
    """Bytes from `offset` of a file that vanished or was truncated before they were read."""

    key: str
    name: str
    offset: int
    system_time: int


def slices(start: Position, end: Position, bytes_per_partition: int) -> list[InputPartition]:
    """One task per `bytes_per_partition` of newly admitted bytes, plus one per lost range."""
    out: list[InputPartition] = []
    system_time = end.wm[1]
    for key, t in sorted(end.files.items()):
        before = start.files.get(key)
        lo = before.offset if before is not None else 0
        for chunk in range(lo, t.offset, bytes_per_partition):
            out.append(
                FileSlice(
                    key,
                    t.name,
                    t.fp,
                    chunk,
                    min(chunk + bytes_per_partition, t.offset),
                    t.offset,
                    chunk == lo,
                    system_time,
                    t.at,
                )
            )
    for key, (offset, name) in sorted(end.lost.items()):
        out.append(LostSlice(key, name, offset, system_time))
    return out


def find_file(
    directory: str,
    key: str,
    name: str,
    fp: tuple[int, int],
    at: tuple[int, int] | None = None,
    limit: int = 0,
) -> BinaryIO | None:
    """Open the file generation `key` (its bytes in the file `at`, when planned there): under
    its planned name, else wherever rotation moved it, else a copy of it (a slice planned
    before copytruncate, read again after it: the copy holds the same bytes up to `limit`)."""
    dev, ino, _ = split_key(key)
    inode = at or (dev, ino)
    fh = open_verified(directory, name, inode)
    names = sorted(os.listdir(directory))
    if fh is None:
        for other in names:
            try:
                st = os.stat(os.path.join(directory, other))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == inode:
                fh = open_verified(directory, other, inode)
                break
    if fh is not None and not fingerprint_matches(fh, fp):
        fh.close()  # the inode now holds another file
        fh = None
    if fh is None and fp[0] > 0:
        for other in names:
            try:
                copy = open(os.path.join(directory, other), "rb")  # noqa: SIM115 - returned
            except OSError:
                continue
            if os.fstat(copy.fileno()).st_size >= limit and fingerprint_matches(copy, fp):
                return copy
            copy.close()
    return fh


@dataclass
class _Columns:
    """Row-wise appends, column-wise Arrow batches."""

    cols: dict[str, list[Any]] = field(
        default_factory=lambda: {name: [] for name in ARROW_SCHEMA.names}
    )

    def __len__(self) -> int:
        return len(self.cols["id"])

    def add(self, **row: Any) -> None:
        for name, values in self.cols.items():
            values.append(row.get(name))

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.cols, schema=ARROW_SCHEMA)
        for values in self.cols.values():
            values.clear()
        return batch


@dataclass(frozen=True, slots=True)
class SliceReader:
    """Turns slices into rows; picklable, so Spark ships it to the executors."""

    stream: str
    directory: str
    parser: Parser
    parser_name: str
    system_timestamps: bool  # a line without an event time gets system_time instead of an error

    def read(self, part: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(part, LostSlice):
            out = _Columns()
            self._error(
                out,
                part.key,
                part.name,
                part.offset,
                part.system_time,
                None,
                "file vanished or was truncated before these bytes were read; "
                "the bytes from this offset are lost",
            )
            yield out.flush()
            return
        assert isinstance(part, FileSlice), part
        yield from self._read_file(part)

    def _read_file(self, part: FileSlice) -> Iterator[pa.RecordBatch]:
        out = _Columns()
        fh = find_file(self.directory, part.key, part.name, part.fp, part.at, part.limit)
        if fh is None:
            self._error(
                out,
                part.key,
                part.name,
                part.start,
                part.system_time,
                None,
                f"file vanished or was replaced before bytes [{part.start}, {part.stop}) "
                "were read; they are lost",
            )
            yield out.flush()
            return
        with fh:
            try:
                for offset, raw in iter_lines(
                    fh, part.start, part.stop, part.limit, owns_first=part.owns_first
                ):
                    self._row(out, part, offset, strip_cr(raw))
                    if len(out) >= BATCH_ROWS:
                        yield out.flush()
            except TruncatedError as exc:
                self._error(
                    out,
                    part.key,
                    part.name,
                    exc.position,
                    part.system_time,
                    None,
                    f"file was truncated; bytes [{exc.position}, {part.limit}) are lost",
                )
        if len(out):
            yield out.flush()

    def _row(self, out: _Columns, part: FileSlice, offset: int, line: bytes) -> None:
        try:
            key, ts, value, content_id = parse_line(self.parser, line, self.parser_name)
            if ts is None:
                if not self.system_timestamps:
                    raise BadLine("no timestamp (set missingTimestamp=system to use system time)")
                ts = part.system_time
        except BadLine as exc:
            self._error(out, part.key, part.name, offset, part.system_time, line, str(exc))
            return
        dev, ino, born = split_key(part.key)
        out.add(
            stream=self.stream,
            id=content_id or record_id(dev, ino, born, offset),
            key=key,
            value=value,
            timestamp=ts,
            system_time=part.system_time,
            source=part.key,
            partition=0,
            offset=offset,
        )

    def _error(
        self,
        out: _Columns,
        key: str,
        name: str,
        offset: int,
        system_time: int,
        line: bytes | None,
        reason: str,
    ) -> None:
        """A dead-letter row: the raw line as value, its position, and why."""
        dev, ino, born = split_key(key)
        path = os.path.join(self.directory, name)
        out.add(
            stream=self.stream,
            id=record_id(dev, ino, born, offset),
            value=line,
            system_time=system_time,
            source=key,
            partition=0,
            offset=offset,
            error=f"{reason} [file {path}, identity {key}, byte offset {offset}]",
        )
