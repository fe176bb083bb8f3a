"""The driver read: a batch's injected rows, read in the driver from the ranges Spark logged.

Kafka and log-file sources are read here, from the ranges in Spark's offset log for the batch
(written before Spark runs it), with the injector's own reader (Kafka's with warm consumers):
the rows Spark would produce, without a Python worker per partition, the round trip through
the JVM and the Arrow collection (0.8 s of a 1.25 s batch measured that way). Otherwise
(a checkpoint not on the local file system, a source of another kind, batch 0 of a log-file
source), Spark reads them and they reach the driver once as Arrow.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from millstream.injectors import kafka, logfile

log = logging.getLogger(__name__)
COLUMNS = (
    "stream", "id", "key", "value", "timestamp", "system_time", "source", "partition", "offset",
    "headers", "error",
)  # fmt: skip


def _logfile_rows(
    options: dict[str, str], start: dict[str, Any], end: dict[str, Any]
) -> Iterator[list[tuple]]:
    for batch in logfile.read_batch(options, start, end):
        yield rows_of(batch)


# The sources the driver reads itself (MILLSTREAM_DRIVER_READ), by format: the same reader
# code their Spark tasks run, giving row tuples (Kafka's without going through Arrow).
DRIVER_READERS = {"millstream-kafka": kafka.read_batch, "millstream-logfile": _logfile_rows}


def offset_log_entry(path: Path) -> list[dict]:
    """The source offsets of one entry of Spark's offset log ("v1", metadata, one line per
    source); a source with no offset yet is "-"."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != "v1":
        raise ValueError(f"{path}: not a v1 offset log entry")
    out = []
    for line in lines[2:]:
        if line.strip() in ("", "-"):
            raise ValueError(f"{path}: a source without an offset")
        out.append(json.loads(line))
    return out


def rows_of(table: Any) -> list[tuple]:
    """Arrow rows as the tuples the shard tasks read (headers as (key, value) pairs)."""
    if table.num_rows == 0:
        return []
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    headers = COLUMNS.index("headers")
    columns[headers] = [
        None if items is None else [(h["key"], h["value"]) for h in items]
        for items in columns[headers]
    ]
    return list(zip(*columns, strict=True))


def local_folder(checkpoint: str) -> str | None:
    """The folder of a checkpoint on this machine's disk (a path or a file: URL); None for a
    distributed file system (hdfs://, s3a://, ...)."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return None
    return os.path.abspath(checkpoint.removeprefix("file://").removeprefix("file:"))


def first_starts(sources: Sequence[tuple[str, dict[str, str]]]) -> list[dict] | None:
    """Each source's initial offset as it kept it (`startFile`); None when one does not."""
    starts = []
    for fmt, options in sources:
        path = options.get("startFile") if fmt == "millstream-kafka" else None
        if path is None:
            return None
        try:
            starts.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            return None
    return starts


class OffsetLog:
    """A query's offset log, read where the driver runs; the batch's own entry read once (the
    driver read and the end estimates both need it)."""

    def __init__(self, checkpoint: str) -> None:
        self.folder = Path(checkpoint.removeprefix("file:")) / "offsets"
        self._last: tuple[int, list[dict] | None] = (-1, None)

    def forget(self) -> None:
        """A new query: its log is read afresh."""
        self._last = (-1, None)

    def entry(self, batch_id: int) -> list[dict] | None:
        """Entry `batch_id`, None when it cannot be read here."""
        if self._last[0] == batch_id:
            return self._last[1]
        try:
            entry: list[dict] | None = offset_log_entry(self.folder / str(batch_id))
        except (OSError, ValueError) as exc:
            log.debug("batch %s: offset log not readable here (%s)", batch_id, exc)
            entry = None
        self._last = (batch_id, entry)
        return entry

    def ranges(
        self, batch_id: int, sources: Sequence[tuple[str, dict[str, str]]]
    ) -> list[tuple[dict, dict]] | None:
        """Each source's (start, end) offsets of this batch, when every source is a Kafka or
        log-file injector and the log can be read here; else None (Spark reads). Batch 0
        starts where each source's kept first start says (Spark's start too: the source gives
        it as its initial offset), so every source must be a Kafka one that keeps it."""
        if any(fmt not in DRIVER_READERS for fmt, _ in sources):
            return None
        ends = self.entry(batch_id)
        starts = self.entry(batch_id - 1) if batch_id > 0 else first_starts(sources)
        if ends is None or starts is None:
            return None
        if len(ends) != len(sources) or len(starts) != len(sources):
            return None
        for (fmt, options), end in zip(sources, ends, strict=True):
            if fmt == "millstream-logfile":
                if "files" not in end:
                    return None  # not the source this slot was built for: let Spark read
                continue
            topics = set(options["topics"].split(",")) if "topics" in options else None
            logged = {key.rsplit(":", 1)[0] for key in end.get("p", {})}
            if "p" not in end or (topics is not None and not logged <= {t.strip() for t in topics}):
                return None  # not the source this slot was built for: let Spark read
        return list(zip(starts, ends, strict=True))


def read_batch(
    batch_df: Any,
    ranges: list[tuple[dict, dict]] | None,
    sources: Sequence[tuple[str, dict[str, str]]],
) -> tuple[dict[str, list[tuple]], int]:
    """The batch's rows in the driver, grouped by stream: from `ranges` with the injectors'
    readers, or (None) from Spark as Arrow."""
    if ranges is None:
        rows = rows_of(batch_df.toArrow())
    else:
        rows = [
            row
            for (fmt, options), (start, end) in zip(sources, ranges, strict=True)
            for chunk in DRIVER_READERS[fmt](options, start, end)
            for row in chunk
        ]
    by_stream: dict[str, list[tuple]] = {}
    for row in rows:
        by_stream.setdefault(row[0], []).append(row)
    return by_stream, len(rows)
