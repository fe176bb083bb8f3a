"""The log-file injector: a PySpark streaming source, short name `millstream-logfile`.

    millstream.injectors.register(spark)  # or spark.dataSource.register(LogFileInjector)
    rows = (spark.readStream.format("millstream-logfile")
            .option("path", "/var/log/myapp").option("stream", "clicks").load())

It tails the files of one directory that match `pattern`, follows each file by identity
(st_dev, st_ino) across rotation renames, and emits one row of `INJECTED_SCHEMA` per complete
line. Positions, file identities and the low watermark all live in Spark's offset (see
`_logfile_plan` for its JSON), so a restart from the checkpoint resumes exactly and a replayed
batch yields identical rows.

Options (validated on the driver when the source is created):
  path                  directory to watch (required, must exist)
  stream                stream name written into every row (required)
  pattern               file-name glob of files to pick up (default *.log); a picked-up file is
                        followed under any later name in the directory
  format                jsonl (default) | text (value = line, no key, timestamp = system_time)
  parser                "module:function", line bytes -> (key bytes, timestamp ms, value bytes);
                        excludes `format`
  keyField              jsonl key field (default "key"; string or integer)
  idField               jsonl field holding the record's own id (default: none; the id is
                        the line's position). Set it when the source may write a record twice.
  timestampField        jsonl event-time field (default "ts")
  timestampUnit         ms (default, integers only) | s (integers or fractions)
  missingTimestamp      error (default: dead-letter the line) | system (use system_time)
  maxRecordsPerTrigger  admission control in lines per batch (or:)
  maxBytesPerTrigger    admission control in bytes per batch
  bytesPerPartition     split large ranges into tasks of this many bytes (default 64 MiB)
  finishedAfterMs       quiet time after which a file with a newer sibling is finished (60000)
  tailWatermark         clock (default: see below) | creation (MillWheel's Figure 10)
  watermarkSlackMs      the clock-following watermark lags the clock by this much (default
                        idleSlackMs, the runtime's MILLSTREAM_IDLE_SLACK_MS; alone 5000)
  tickMs                clock tick carried in the offset: a batch per tick (default 1000)
  redis.url, app        publish the watermark to the authority of `app` (both or neither)
  instance              this injector's name among the stream's injectors (host:path)
  throttle              true: plan no batch while a join's throttle pauses the stream (the
                        runtime sets it for a join's primary stream; needs redis.url and app)

Decisions:
- system_time is the plan time of the batch that delivers the line: the end offset's `wm[1]`.
  It is checkpointed with the offset, so replays keep it, and it is close to arrival time, so
  dedup buckets and catalog GC age like Kafka's append time. (A per-file first-seen time would
  date every line of a day-long log to the morning and hold GC back all day.)
- Timestamps are integer milliseconds by default; `timestampUnit=s` takes (fractional) seconds,
  floored to the millisecond exactly. A float in a millisecond field is an error row.
- A file is finished when it has not been modified for `finishedAfterMs` and a newer file
  (later creation estimate) is followed: rotation has moved the writer on.
- A file's creation time is estimated once, when it is first seen, as the smaller of its mtime
  and the event time of its first complete line. Linux has no portable birth time, and the
  mtime of a file found with a backlog is later than the lines it holds.
- Low watermark (MillWheel Figure 10): min over unfinished files of their creation time; a file
  with unread bytes always counts. Creation times never pass clock - `watermarkSlackMs` (the
  clock is quantised to the tick), which it follows once every file is finished and read. With
  `tailWatermark=clock` (the default), a file read to its end counts instead as the newer of
  clock - slack and its last line's event time (never past the clock), as a caught-up Kafka
  partition does: a log that is never rotated still advances the watermark, and a window
  closes once a later line arrived. A partial last line (the writer mid-line) is not unread
  bytes: it holds nothing. Monotonic; published to Redis when Spark has finished the batch
  whose end offset carries it.
- A malformed line becomes a row with `error` set (the raw line as value): never dropped.
  Bytes that vanish before they are read (a file deleted or truncated under the reader) become an
  error row too, at the first lost offset.

Limits: the directory must be visible at the same path on the driver and every executor (local
mode or a shared mount). Files are followed within the directory only; a file rotated into
another directory or compressed into a new file is not.

Rotation, both of logrotate's ways. Rename (the default): the file keeps its identity under its
new name, and a writer still appending to it is read until it is finished; a file created and
rotated while the pipeline was down is picked up under its rotated name (`app.log.1`, not a
compressed `.gz`) when it was written since the last plan. copytruncate: when a
followed file shrinks below the read position or its first 64 bytes change while another file in
the directory starts with the same bytes, that copy holds the rest of it: it is read from the
copy at the same offsets under the same ids (a log line says so), and the truncated file is read
afresh as a new file. A copy seen before the truncation is not picked up as a file of its own.
Only bytes no file holds any more are reported lost (an error row).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, BinaryIO

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from millstream.errors import TransientError
from millstream.injectors._logfile_directory import scan_directory
from millstream.injectors._logfile_lines import NEWLINE, PROBE, last_line_end, strip_cr
from millstream.injectors._logfile_offset import Position
from millstream.injectors._logfile_options import OPTIONS as OPTIONS  # re-exported
from millstream.injectors._logfile_options import SHORT_NAME, LogFileOptions
from millstream.injectors._logfile_parse import (
    BadLine,
    Parser,
    parse_line,
)
from millstream.injectors._logfile_plan import Budget, Planner, Rules
from millstream.injectors._runner_exit import exit_if_query_stopped
from millstream.injectors.schema import INJECTED_SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa

    from millstream.injectors._logfile_read import SliceReader

# As in `injectors/kafka.py`: the processes that only create the source or plan its reads
# import this module too, so Arrow (the slice reader) and Redis's client are imported where
# they are used.

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogFileInjector(DataSource):
    """Spark entry point; options are validated here, on the driver."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.settings = LogFileOptions.from_options(options)

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return INJECTED_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogFileStreamReader(self.settings)


class LogFileStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Thin adapter from Spark's camelCase calls to the planner and the slice reader.

    Spark calls `initialOffset`, `latestOffset`, `partitions` and `commit` on the driver's
    planner process and `read` in executor Python workers. The reader keeps no positions: it
    holds only the AvailableNow snapshot, which Spark asks it to remember, and the last
    watermark it published, to skip redundant Redis calls.
    """

    def __init__(self, settings: LogFileOptions) -> None:
        self.settings = settings
        self._slice_reader: SliceReader | None = None  # built at the first read
        parser = settings.line_parser()[0]
        self._planner = Planner(
            directory=settings.path,
            pattern=settings.pattern,
            rules=Rules(
                finished_after_ms=settings.finished_after_ms,
                slack_ms=settings.watermark_slack_ms,
                tick_ms=settings.tick_ms,
                tail_clock=settings.tail_watermark == "clock",
            ),
            first_timestamp=partial(first_line_timestamp, parser),
            last_timestamp=partial(last_line_timestamp, parser),
        )
        # AvailableNow: the files and sizes present when the trigger started, and that moment.
        self._snapshot: tuple[dict[tuple[int, int], int], int] | None = None
        self._published: tuple[int, int] | None = None  # skips needless Redis round trips
        self._published_counts: dict[str, int] = {}
        self._throttle: Any = None
        if settings.throttle and settings.redis_url:
            from millstream.injectors._throttle_flag import ThrottleFlag

            self._throttle = ThrottleFlag(settings.redis_url, settings.app or "", settings.stream)

    # --- Spark calls (driver) ----------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        return Position.initial().to_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.settings.max_records_per_trigger is not None:
            return ReadMaxRows(self.settings.max_records_per_trigger)
        if self.settings.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.settings.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Plan the next batch. Also publishes `start`'s watermark: see `commit`."""
        prev = Position.from_offset(start)
        self._publish(prev)
        if self._throttle is not None and self._throttle.paused():
            return start  # a join's throttle: no batch, the watermark held at the unread lines
        caps, now = None, _now_ms()
        if self._snapshot is not None:
            caps, now = self._snapshot
        nxt = self._planner.plan(prev, now, _budget(limit), caps)
        return start if nxt is prev else nxt.to_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        entries = scan_directory(self.settings.path, self.settings.pattern)
        for inode, entry in scan_directory(self.settings.path, self.settings.pattern).items():
            entries.setdefault(inode, entry)  # a rename may hide a file from one listing
        self._snapshot = ({i: e.size for i, e in entries.items()}, _now_ms())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        from millstream.injectors._logfile_read import slices

        return slices(
            Position.from_offset(start),
            Position.from_offset(end),
            self.settings.bytes_per_partition,
        )

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished the batch ending at `end`: publish its watermark (monotonic in Redis).

        Spark calls commit(end) only while planning the *next* batch, so the last batch of an
        AvailableNow run is never committed in that run. `latestOffset(start)` therefore
        publishes `start`'s watermark too: Spark runs one batch at a time and writes its commit
        log before planning the next, so the batch ending at `start` is done by then (on a
        restart, an uncommitted batch is re-run before any planning).
        """
        self._publish(Position.from_offset(end))

    def stop(self) -> None:
        exit_if_query_stopped()

    def _publish(self, position: Position) -> None:
        if self.settings.redis_url is None or position.wm[1] == Position.initial().wm[1]:
            return  # no Redis, or nothing planned yet: no estimate to publish
        last = self._published
        if last is not None and position.wm[0] <= last[0] and position.wm[1] <= last[1]:
            return  # already raised at least this far by this process
        publish_watermark(self.settings, position.wm)
        self._published = position.wm
        changed = position.counts and position.counts != self._published_counts
        if changed and publish_counts(self.settings, position.counts):
            self._published_counts = dict(position.counts)  # no write again until they move

    # --- executors -----------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if self._slice_reader is None:
            self._slice_reader = slice_reader(self.settings)
        return self._slice_reader.read(partition)


def read_batch(
    options: Mapping[str, str], start: Mapping[str, Any], end: Mapping[str, Any]
) -> Iterator[pa.RecordBatch]:
    """A micro-batch's rows read where this is called (the fused runtime's driver): the slices
    from `start` to `end` (offsets as Spark logs them), cut as `partitions` cuts them and read
    by the reader Spark's tasks run, built afresh as a task's is: the same rows, ids and
    errors."""
    from millstream.injectors._logfile_read import slices

    settings = LogFileOptions.from_options(options)
    reader = slice_reader(settings)
    parts = slices(Position.from_offset(dict(start)), Position.from_offset(dict(end)),
                   settings.bytes_per_partition)  # fmt: skip
    for part in parts:
        yield from reader.read(part)


def slice_reader(settings: LogFileOptions) -> SliceReader:
    """The reader of a batch's slices, as Spark's tasks and the driver read run it."""
    from millstream.injectors._logfile_read import SliceReader

    parser, parser_name = settings.line_parser()
    return SliceReader(
        stream=settings.stream,
        directory=settings.path,
        parser=parser,
        parser_name=parser_name,
        system_timestamps=settings.missing_timestamp == "system" or settings.format == "text",
    )


def first_line_timestamp(parser: Parser, fh: BinaryIO) -> int | None:
    """Event time of the file's first complete line, if it has one: a creation estimate."""
    fh.seek(0)
    head = fh.read(PROBE)
    nl = head.find(NEWLINE)
    if nl < 0:
        return None
    try:
        ts = parse_line(parser, strip_cr(head[:nl]), "")[1]
    except BadLine:
        return None
    return ts


LAST_LINE_BLOCK = 4096  # a log line is usually far shorter: one small read per trigger


def last_line_timestamp(parser: Parser, fh: BinaryIO, end: int) -> int | None:
    """Event time of the complete line ending at `end`, if it fits in one probe and parses:
    what a caught-up file's data implies for its watermark."""
    lo = max(0, end - PROBE)
    start = last_line_end(fh, lo, end - 1, block=LAST_LINE_BLOCK)  # reads backwards
    if start == lo and lo > 0:
        return None  # a line longer than the probe: unknown, the clock rule alone
    fh.seek(start)
    data = fh.read(end - start)
    if not data.endswith(NEWLINE):
        return None
    try:
        return parse_line(parser, strip_cr(data[:-1]), "")[1]
    except BadLine:
        return None


def _budget(limit: ReadLimit) -> Budget:
    if isinstance(limit, ReadMaxRows):
        return Budget(rows=limit.max_rows)
    if isinstance(limit, ReadMaxBytes):
        return Budget(bytes=limit.max_bytes)
    if isinstance(limit, ReadMaxFiles):
        return Budget(files=limit.max_files)
    return Budget()  # ReadAllAvailable; ReadMinRows is never our default, so read what is there


def publish_watermark(settings: LogFileOptions, wm: tuple[int, int]) -> None:
    """Raise this instance's injector watermark in the authority; Redis keeps the maximum."""
    import redis

    from millstream.state.client import connect
    from millstream.state.watermarks import Watermark, WatermarkAuthority

    assert settings.redis_url is not None and settings.app is not None
    authority = WatermarkAuthority(connect(settings.redis_url), settings.app)
    try:
        authority.publish_injector(settings.stream, settings.instance, Watermark(*wm))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TransientError(
            f"publishing the watermark of stream {settings.stream!r} failed: {exc}; check that "
            "Redis is up (the query fails, and on restart the batch commits and publishes again)"
        ) from exc


def publish_counts(settings: LogFileOptions, counts: dict[str, int]) -> bool:
    """What rotation did (`_logfile_offset.EVENTS`), for `millstream status`: the counts this
    checkpoint's positions carry, so a replayed or re-published batch sets the same values."""
    import redis

    from millstream.state.client import connect
    from millstream.state.keys import INJECTOR_EVENTS, app_key

    assert settings.redis_url is not None and settings.app is not None
    key = app_key(settings.app, INJECTOR_EVENTS, settings.stream)
    try:
        connect(settings.redis_url).hset(
            key, mapping={f"{settings.instance}|{name}": n for name, n in counts.items()}
        )
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("log-file counters of %s not published this batch: %s", settings.stream, exc)
        return False
    return True


__all__ = ["SHORT_NAME", "LogFileInjector", "LogFileOptions", "LogFileStreamReader"]
