"""The Kafka injector: a PySpark streaming data source, short name `millstream-kafka`.

    spark.dataSource.register(KafkaInjector)
    df = (spark.readStream.format("millstream-kafka")
          .option("bootstrap.servers", "localhost:9092").option("topics", "orders")
          .option("redis.url", "redis://localhost:6379/0").load())

Rows follow `INJECTED_SCHEMA`. Records are never dropped: a record whose id or event time
cannot be derived becomes a row with `error` set, for the runtime to dead-letter.

This module is the thin adapter with Spark's camelCase methods; the work is elsewhere:
`_kafka_options` (validation), `_kafka_plan` + `_kafka_probe` (driver: end offsets and
watermark), `_kafka_read` (executors: one partition's range into Arrow), `_kafka_consume`
(what their consumers share), `watermark` (the estimation rule), `_kafka_offsets` (the offset
format, admission control, record ids).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from millstream.errors import TransientError
from millstream.injectors._kafka_offsets import InjectorOffset, KafkaRange
from millstream.injectors._kafka_options import (
    OPTIONS,
    SHORT_NAME,
    KafkaInjectorOptions,
    options_from_settings,
)
from millstream.injectors._runner_exit import exit_if_query_stopped
from millstream.injectors.schema import INJECTED_SCHEMA
from millstream.state.watermarks import Watermark, WatermarkAuthority

if TYPE_CHECKING:
    import pyarrow as pa

    from millstream.injectors._kafka_plan import OffsetPlanner

# Spark imports this module in every Python process that touches the source: the workers that
# create the data source and plan its reads need only the class and its options. So the Kafka
# and Redis clients, Arrow and the planner are imported where they are used (`_plan`, `read`,
# `_publish`): the data source's process peaked at 39 MB instead of 104 (README, Memory).

__all__ = ["OPTIONS", "KafkaInjector", "KafkaRange", "KafkaStreamReader", "options_from_settings"]

log = logging.getLogger(__name__)


def batch_ranges(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[KafkaRange]:
    """The Kafka ranges of a micro-batch from `start` to `end` (offset JSON as Spark logs it):
    one per partition with records in [start, end)."""
    first = InjectorOffset.from_json(start).positions
    last = InjectorOffset.from_json(end).positions
    return [
        KafkaRange(topic, partition, first.get((topic, partition), stop), stop)
        for (topic, partition), stop in sorted(last.items())
        if stop > first.get((topic, partition), stop)
    ]


def read_batch(
    options: Mapping[str, str], start: Mapping[str, Any], end: Mapping[str, Any]
) -> Iterator[list[tuple]]:
    """A micro-batch's records read where this is called (the fused runtime's driver), with
    the same rows, ids and errors as the source's Spark tasks would produce (`read_range` on
    each of `batch_ranges`), as row tuples in INJECTED_SCHEMA's column order, partition after
    partition. Up to eight partitions are read at once, each by a consumer of its own (kept
    warm between batches): their fetches wait on the broker side by side, not one after
    another."""
    from millstream.injectors._kafka_read import read_range_rows

    parsed = KafkaInjectorOptions.parse(options)
    parts = [p for p in batch_ranges(start, end) if p.end > p.start]
    if len(parts) <= 1:
        for part in parts:
            yield from read_range_rows(parsed, part)
        return
    reads = [_READERS.submit(lambda part: list(read_range_rows(parsed, part)), p) for p in parts]
    try:
        for read in reads:
            yield from read.result()
    finally:
        futures_wait(reads)  # no read goes on behind a failed batch


# The driver's parallel partition reads (a thread each, mostly waiting on the broker).
_READERS = ThreadPoolExecutor(8, thread_name_prefix="millstream-read")


class KafkaInjector(DataSource):
    """Options are validated here, on the driver, before any task runs (see `OPTIONS`)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = KafkaInjectorOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return INJECTED_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(self.parsed)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark calls `initialOffset`, `latestOffset`, `partitions` and `commit` on the driver (one
    long-lived planner process per query) and `read` on executors (a copy of this object)."""

    def __init__(self, options: KafkaInjectorOptions) -> None:
        self._options = options
        self._planner: OffsetPlanner | None = None
        self._authority: WatermarkAuthority | None = None
        self._published: Watermark | None = None
        self._throttle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the options travel to executors; clients stay with the driver.
        return {"_options": self._options, "_planner": None, "_authority": None,
                "_published": None, "_throttle": None}  # fmt: skip

    def _plan(self) -> OffsetPlanner:
        if self._planner is None:
            from millstream.injectors._kafka_plan import OffsetPlanner

            self._planner = OffsetPlanner(self._options)
        return self._planner

    # ---------------------------------------------------------------- driver

    def initialOffset(self) -> dict[str, Any]:
        return self._plan().initial().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_records_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._plan().freeze_targets()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Only ReadMaxRows limits; the engine passes ReadAllAvailable to mean "no limit".
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        begin = InjectorOffset.from_json(start)
        # The micro-batch engine asks for the batch after `start` only once the batch ending
        # at `start` is committed, so its watermark may be published now. Spark commits a
        # batch to the source only when it builds the next one: without this, the last batch
        # of an AvailableNow run would never publish its watermark.
        self._publish(begin.watermark)
        if self._paused():
            max_rows = 0  # a join's throttle: nothing new, the watermark held at the backlog
        try:
            end = self._plan().latest(begin, max_rows)
        except TransientError as exc:
            # The broker did not answer in time (e.g. still settling after a crash of this
            # pipeline): no batch this trigger, a fresh probe client at the next one, the
            # planner's outage hold kept. Retrying is right here; failing the query would stop
            # every shard for a passing stall.
            log.warning(
                "injector %s: no end offsets this trigger (%s); retrying", self._options.stream, exc
            )
            self._plan().renew_probe()
            return start
        # Returning `start` itself (same JSON text) tells Spark there is no new batch.
        return start if end is None else end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One task per partition with records in [start, end); empty ranges get no task."""
        return batch_ranges(start, end)

    def commit(self, end: dict[str, Any]) -> None:
        """The batch up to `end` is processed: publish the watermark stored in `end`."""
        self._publish(InjectorOffset.from_json(end).watermark)

    def _paused(self) -> bool:
        """A join's throttle pauses this stream (`injectors/_throttle_flag.py`)."""
        if not self._options.throttle or not self._options.redis_url:
            return False
        if self._throttle is None:
            from millstream.injectors._throttle_flag import ThrottleFlag

            self._throttle = ThrottleFlag(
                self._options.redis_url, self._options.app, self._options.stream
            )
        return bool(self._throttle.paused())

    def _publish(self, watermark: Watermark) -> None:
        """Raise the injector's watermark in Redis (the authority keeps it monotonic)."""
        if not self._options.redis_url or watermark == self._published:
            return
        import redis

        from millstream.state.client import connect

        try:
            if self._authority is None:
                self._authority = WatermarkAuthority(
                    connect(self._options.redis_url), self._options.app
                )
            self._authority.publish_injector(
                self._options.stream, self._options.instance, watermark
            )
            self._published = watermark
        except (
            TransientError,
            redis.ConnectionError,
            redis.TimeoutError,
            redis.OutOfMemoryError,  # Redis at maxmemory: the driver reports it and retries
        ) as exc:
            # Safe to skip: the watermark only holds; the next batch publishes a newer one.
            log.warning("injector watermark not published this batch: %s", exc)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None
        exit_if_query_stopped()

    # ---------------------------------------------------------------- executors

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from millstream.injectors._kafka_read import read_range

        assert isinstance(partition, KafkaRange), type(partition)
        return read_range(self._options, partition)
