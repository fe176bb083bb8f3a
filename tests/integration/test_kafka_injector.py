"""The Kafka injector under a real broker, real Redis and real Spark.

Ground truth comes from the producer's delivery reports (topic, partition, offset of every
record written), never from the injector: each test checks the injector's rows against what
the broker acknowledged.
"""

from __future__ import annotations

import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from millstream.injectors._kafka_read import close_consumers
from millstream.injectors.kafka import KafkaInjector, KafkaRange
from millstream.injectors.record_ids import derived_id
from millstream.state.client import connect
from millstream.state.watermarks import Watermark, WatermarkAuthority
from millstream.testing.infra import create_topic

pytestmark = pytest.mark.spark

FORMAT = "millstream-kafka"
Row = dict[str, Any]
Headers = list[tuple[str, bytes | None]]
Record = tuple[int, bytes | None, bytes | None, int, Any]  # partition, key, value, ts, headers


# ---------------------------------------------------------------- helpers


def produce(
    bootstrap: str,
    topic: str,
    records: list[Record],
) -> list[tuple[int, int]]:
    """Write (partition, key, value, timestamp ms, headers); return (partition, offset) each."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    placed: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[Any] = []

    def report(index: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                placed[index] = (msg.partition(), msg.offset())

        return done

    for i, (partition, key, value, ts, headers) in enumerate(records):
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp=ts,
            headers=headers,
            on_delivery=report(i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    assert all(p is not None for p in placed)
    return [p for p in placed if p is not None]


def simple_records(n: int, base_ts: int, partitions: int = 2) -> list[Any]:
    """Key i, a 20-byte value, ts base + i; headers on every 7th (a duplicate and a null)."""
    out = []
    for i in range(n):
        headers = [("h", b"\x00\xff%d" % i), ("h", b"dup"), ("nil", None)] if i % 7 == 0 else None
        out.append((i % partitions, b"k%d" % i, b"v" * 19 + bytes([i % 256]), base_ts + i, headers))
    return out


class Runner:
    """Runs the injector into a foreachBatch that collects rows on the driver."""

    def __init__(self, spark: Any, checkpoint: str) -> None:
        self.spark = spark
        self.checkpoint = checkpoint
        self.batches: list[tuple[int, list[Row]]] = []
        self.on_batch: Callable[[int, list[Row]], None] | None = None

    def _writer(self, options: dict[str, str]) -> Any:
        def capture(df: Any, batch_id: int) -> None:
            rows = [r.asDict(recursive=True) for r in df.collect()]
            self.batches.append((batch_id, rows))
            if self.on_batch is not None:
                self.on_batch(batch_id, rows)

        frame = self.spark.readStream.format(FORMAT).options(**options).load()
        return frame.writeStream.foreachBatch(capture).option("checkpointLocation", self.checkpoint)

    def available_now(self, options: dict[str, str], timeout: float = 180) -> list[Row]:
        """One run up to the ends that exist now; returns the rows it delivered."""
        before = len(self.batches)
        query = self._writer(options).trigger(availableNow=True).start()
        try:
            finished = query.awaitTermination(timeout)
        except Exception as exc:  # StreamingQueryException: the query failed
            raise AssertionError(f"query failed: {exc}") from exc
        finally:
            query.stop()
        assert finished, "availableNow query did not finish"
        return [row for _, rows in self.batches[before:] for row in rows]

    def start(self, options: dict[str, str], interval: str = "200 milliseconds") -> Any:
        return self._writer(options).trigger(processingTime=interval).start()


@pytest.fixture(scope="module")
def spark_kafka(spark: Any) -> Any:
    spark.dataSource.register(KafkaInjector)
    return spark


def test_registration_finds_sparks_static_source_registry(spark: Any) -> None:
    """`register` spares each start Spark's scan for `pyspark_*` packages (2.5 s here) through
    a Spark-internal registry; a PySpark that moved it would quietly bring the scan back."""
    from millstream.injectors import _skip_static_source_lookup

    assert _skip_static_source_lookup(spark)


@pytest.fixture
def runner(spark_kafka: Any, tmp_checkpoint: str) -> Runner:
    return Runner(spark_kafka, tmp_checkpoint)


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Fresh uniquely named topics, deliberately not deleted afterwards.

    On Tansu, deleting a topic that a consumer fetched moments before crashes librdkafka
    (SIGSEGV in rd_kafka_metadata_cache_find, reproduced with confluent-kafka 2.16), and the
    injector caches its consumers in Spark's Python workers, where such a crash would fail a
    later test's task. Test topics die with the session's broker instead.
    """

    def make(partitions: int = 1) -> str:
        return create_topic(kafka_bootstrap, partitions=partitions)

    return make


def headers_of(row: Row) -> Headers:
    return [(h["key"], h["value"]) for h in row["headers"]]


def check_rows(rows: list[Row], topic: str, records: list[Any], placed: list[Any]) -> None:
    """Every produced record exactly once, byte-exact, with a stable derived id."""
    by_position = {(row["partition"], row["offset"]): row for row in rows}
    assert len(by_position) == len(rows), "a record was delivered twice"
    assert set(by_position) == set(placed), "records missing or extra"
    for (partition, key, value, ts, headers), where in zip(records, placed, strict=True):
        row = by_position[where]
        assert row["id"] == derived_id(topic, *where)
        assert (row["key"], row["value"]) == (key, value)
        assert (row["timestamp"], row["system_time"]) == (ts, ts)
        assert headers_of(row) == (headers or [])
        assert (row["stream"], row["source"], row["partition"]) == (topic, topic, partition)
        assert row["error"] is None


# ---------------------------------------------------------------- tests


def test_every_record_once_and_restart_reads_only_new_records(
    runner: Runner, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    options = {"bootstrap.servers": kafka_bootstrap, "topics": topic}
    first = simple_records(120, base_ts=1_700_000_000_000)
    placed = produce(kafka_bootstrap, topic, first)

    rows = runner.available_now(options)
    check_rows(rows, topic, first, placed)

    # Same checkpoint, more data: only the new records come, with ids from their positions.
    more = simple_records(45, base_ts=1_700_000_100_000)
    placed_more = produce(kafka_bootstrap, topic, more)
    again = runner.available_now(options)
    check_rows(again, topic, more, placed_more)

    # Nothing new: a third run delivers nothing.
    assert runner.available_now(options) == []


def test_replayed_batch_reads_exactly_the_same_rows(
    runner: Runner, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """A batch whose foreachBatch failed is replayed from the offset log after a restart: it
    must yield the same rows, even though more records arrived in between."""
    topic = new_topic(partitions=2)
    options = {"bootstrap.servers": kafka_bootstrap, "topics": topic}
    first = simple_records(60, base_ts=1_700_000_000_000)
    placed = produce(kafka_bootstrap, topic, first)

    def fail(batch_id: int, rows: list[Row]) -> None:
        raise RuntimeError("injected failure after reading the batch")

    runner.on_batch = fail
    with pytest.raises(AssertionError, match="injected failure"):
        runner.available_now(options)
    (failed_id, failed_rows), *_ = runner.batches
    assert len(failed_rows) == 60

    later = simple_records(30, base_ts=1_700_000_200_000)
    placed_later = produce(kafka_bootstrap, topic, later)
    runner.on_batch = None
    runner.batches.clear()
    runner.available_now(options)
    replay_id, replay_rows = runner.batches[0]
    assert replay_id == failed_id
    key = lambda r: (r["partition"], r["offset"])  # noqa: E731
    assert sorted(replay_rows, key=key) == sorted(failed_rows, key=key)
    rest = [row for _, rows in runner.batches[1:] for row in rows]
    check_rows(rest, topic, later, placed_later)
    check_rows(replay_rows, topic, first, placed)


def test_max_records_per_trigger_and_watermark_never_passes_a_pending_record(
    runner: Runner,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    redis_url: str,
    redis_namespace: str,
) -> None:
    topic = new_topic(partitions=2)
    records = simple_records(100, base_ts=1_700_000_000_000)
    placed = produce(kafka_bootstrap, topic, records)
    authority = WatermarkAuthority(connect(redis_url), redis_namespace)
    published: list[tuple[int, int | None]] = []

    def observe(batch_id: int, rows: list[Row]) -> None:
        # Spark commits batch N-1 to the source before it runs batch N.
        current = authority.injector_stream(topic)
        published.append((current.event, min((r["timestamp"] for r in rows), default=None)))

    runner.on_batch = observe
    rows = runner.available_now(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "maxRecordsPerTrigger": "30",
            "redis.url": redis_url,
            "app": redis_namespace,
            "idleSlackMs": "5000",
        }
    )
    check_rows(rows, topic, records, placed)
    sizes = [len(batch) for _, batch in runner.batches]
    assert max(sizes) <= 30 and len(sizes) >= 4, sizes

    # Timestamps rise within each partition, so a correct watermark is never above a record
    # delivered later, and it only rises.
    events = [event for event, _ in published]
    assert events == sorted(events)
    for i, (event, _) in enumerate(published):
        later = [ts for _, ts in published[i:] if ts is not None]
        assert not later or event <= min(later), (i, published)
    # Caught up at the end: the idle policy, now - idleSlackMs.
    final = authority.injector_stream(topic).event
    assert time.time() * 1000 - 5000 - 120_000 < final <= time.time() * 1000 - 5000


def test_idle_topic_watermark_follows_the_clock(
    runner: Runner,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    redis_url: str,
    redis_namespace: str,
) -> None:
    topic = new_topic(partitions=2)
    authority = WatermarkAuthority(connect(redis_url), redis_namespace)
    slack = 1500
    query = runner.start(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "redis.url": redis_url,
            "app": redis_namespace,
            "instance": "inj-1",
            "idleSlackMs": str(slack),
            "tickMs": "300",
        },
        interval="50 milliseconds",
    )
    seen: list[tuple[float, int]] = []
    began = time.monotonic()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len({wm for _, wm in seen}) < 4:
            time.sleep(0.3)
            assert query.exception() is None, query.exception()
            current = authority.injector_stream(topic)  # only inj-1 reports
            if current.event > 0:
                seen.append((time.time() * 1000, current.event))
    finally:
        query.stop()
    elapsed = time.monotonic() - began
    assert len({wm for _, wm in seen}) >= 4, f"the idle watermark did not advance: {seen}"
    for now, wm in seen:
        # now - slack at planning time, published after the (empty) batch ran.
        assert now - slack - 10_000 < wm <= now - slack, (now, wm)
    assert [wm for _, wm in seen] == sorted(wm for _, wm in seen)
    # Empty ticks are batches without records, at most one per tick although Spark asks for
    # a new batch every 50 ms.
    assert all(rows == [] for _, rows in runner.batches)
    assert 3 <= len(runner.batches) <= elapsed / 0.3 + 2, (len(runner.batches), elapsed)


@pytest.fixture
def extractor_module(spark_kafka: Any, tmp_path: Path) -> Iterator[str]:
    """A user module shipped to the executors with addPyFile, as a user would."""
    name = f"ms_extract_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(
        textwrap.dedent(
            """
            def event_time(key, value, headers):
                n = int(key[1:])
                if n % 5 == 1:
                    raise ValueError(f"bad record {n}")
                if n % 5 == 2:
                    return "soon"
                return 1_000 * n

            def record_id(key, value, headers):
                return b"id-" + key
            """
        )
    )
    spark_kafka.sparkContext.addPyFile(str(path))
    yield name


def test_extractor_failures_become_error_rows_not_drops(
    runner: Runner,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    extractor_module: str,
) -> None:
    topic = new_topic(partitions=2)
    records = simple_records(40, base_ts=1_700_000_000_000)
    placed = produce(kafka_bootstrap, topic, records)
    rows = runner.available_now(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "stream": "clicks",
            "timestampExtractor": f"{extractor_module}:event_time",
            "idExtractor": f"{extractor_module}:record_id",
        }
    )
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(placed)
    for row in rows:
        n = int(row["key"][1:])
        assert row["id"] == b"id-" + row["key"]
        assert row["stream"] == "clicks"
        assert row["system_time"] == 1_700_000_000_000 + n
        if n % 5 == 1:
            assert row["timestamp"] is None
            assert "timestampExtractor" in row["error"] and "bad record" in row["error"]
        elif n % 5 == 2:
            assert row["timestamp"] is None
            assert "returned str" in row["error"]
        else:
            assert (row["timestamp"], row["error"]) == (1_000 * n, None)


def test_id_header_and_missing_header_is_an_error_row(
    runner: Runner, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    records: list[Record] = [
        (0, b"a", b"1", 1_000, [("msid", b"\x01id-a")]),
        (0, b"b", b"2", 2_000, None),
        (0, b"c", b"3", 3_000, [("msid", b"old"), ("msid", b"new")]),
    ]
    placed = produce(kafka_bootstrap, topic, records)
    rows = sorted(
        runner.available_now(
            {"bootstrap.servers": kafka_bootstrap, "topics": topic, "idHeader": "msid"}
        ),
        key=lambda r: r["offset"],
    )
    assert [r["offset"] for r in rows] == [offset for _, offset in placed]
    assert rows[0]["id"] == b"\x01id-a" and rows[0]["error"] is None
    assert rows[1]["id"] == derived_id(topic, 0, rows[1]["offset"])
    assert "no 'msid' header" in rows[1]["error"]
    assert rows[2]["id"] == b"new" and rows[2]["error"] is None


def test_same_range_read_twice_is_identical_across_transaction_markers(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Ranges may end on offsets without a record (commit markers): the read must stop there
    at once, not wait for readTimeoutMs, and read the same rows every time."""
    topic = new_topic(partitions=1)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    for txn in range(2):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, key=b"k%d" % (txn * 5 + i), value=b"v", partition=0)
        producer.commit_transaction(30)
    # Offsets: records 0-4, marker 5, records 6-10, marker 11; the end is 12.
    source = KafkaInjector({"bootstrap.servers": kafka_bootstrap, "topics": topic})
    reader = source.streamReader(source.schema())
    try:
        end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert end["p"] == {f"{topic}:0": 12}

        def read(start: int, stop: int) -> list[Row]:
            began = time.monotonic()
            rows = [
                row
                for batch in reader.read(KafkaRange(topic, 0, start, stop))
                for row in batch.to_pylist()
            ]
            assert time.monotonic() - began < 5, "the read waited at a marker"
            return rows

        whole = read(0, 12)
        assert [r["offset"] for r in whole] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
        assert read(0, 12) == whole
        assert [r["offset"] for r in read(0, 6)] == [0, 1, 2, 3, 4]
        assert [r["offset"] for r in read(5, 11)] == [6, 7, 8, 9, 10]
        assert read(11, 12) == []
    finally:
        reader.stop()
        close_consumers()  # read() ran in this process and cached a consumer here


def test_commit_publishes_the_offsets_watermark_monotonically(
    kafka_bootstrap: str, redis_url: str, redis_namespace: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    source = KafkaInjector(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "redis.url": redis_url,
            "app": redis_namespace,
            "instance": "a",
        }
    )
    reader = source.streamReader(source.schema())
    authority = WatermarkAuthority(connect(redis_url), redis_namespace)

    def offset(event: int, system: int) -> dict[str, Any]:
        return {"p": {f"{topic}:0": 0}, "wm": [event, system], "tick": 1}

    reader.commit(offset(5_000, 7_000))
    assert authority.injector_stream(topic) == Watermark(5_000, 7_000)
    reader.commit(offset(4_000, 9_000))  # event time may not go back; system time rises
    assert authority.injector_stream(topic) == Watermark(5_000, 9_000)
    authority.declare_injectors(topic, ["a", "b"])  # instance b never reported: unknown
    assert authority.injector_stream(topic).event < 0


def test_streaming_query_picks_up_records_as_they_arrive(
    runner: Runner, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    query = runner.start(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "startingOffsets": "latest",
            "tickMs": "300",
        }
    )
    try:
        # startingOffsets=latest is resolved when the query starts: wait for its first batch.
        deadline = time.monotonic() + 60
        while not runner.batches and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.1)
        produced: list[Any] = []
        records = simple_records(50, base_ts=1_700_000_000_000)
        for chunk in range(5):  # while the query runs in the background
            produced.extend(produce(kafka_bootstrap, topic, records[chunk * 10 : chunk * 10 + 10]))
            time.sleep(0.4)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = [r for _, rows in runner.batches for r in rows]
            if len(got) >= len(produced):
                break
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
    finally:
        query.stop()
    rows = [r for _, rows in runner.batches for r in rows]
    check_rows(rows, topic, records, produced)
    assert sum(1 for _, batch in runner.batches if batch) >= 2, "records came in one batch"


GOOD = {"bootstrap.servers": "localhost:9092", "topics": "t"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "t"}, "bootstrap.servers is required"),
        ({"bootstrap.servers": "localhost:9092"}, "topics is required"),
        ({**GOOD, "startingOffsets": "middle"}, "startingOffsets"),
        ({**GOOD, "maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
        ({**GOOD, "timestampExtractor": "no_such_module_xyz:f"}, "timestampExtractor"),
        ({**GOOD, "kafka.group.id": "mine"}, "kafka.group.id"),
        ({**GOOD, "maxRecords": "5"}, "unknown option 'maxrecords'"),
    ],
)
def test_bad_options_fail_on_the_driver_naming_the_option(
    spark_kafka: Any, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        spark_kafka.readStream.format(FORMAT).options(**options).load()


def test_unknown_topic_fails_with_its_name(runner: Runner, kafka_bootstrap: str) -> None:
    missing = f"millstream-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(AssertionError, match=f"{missing}.*does not exist"):
        runner.available_now({"bootstrap.servers": kafka_bootstrap, "topics": missing}, timeout=60)


@pytest.mark.parametrize("id_header", [None, "msid"])
def test_driver_rows_are_the_rows_spark_reads(
    kafka_bootstrap: str, new_topic: Callable[..., str], id_header: str | None
) -> None:
    """The fused runtime's driver reads ranges as row tuples (`read_range_rows`), Spark's tasks
    as Arrow (`read_range`): the same rows, ids, headers and error rows, in the same order.
    Covers derived and header ids, a missing id header, headers with duplicates and nulls,
    records without headers, and a missing timestamp (an error row)."""
    from millstream.connectors.driver_read import rows_of as _rows
    from millstream.injectors._kafka_options import KafkaInjectorOptions
    from millstream.injectors._kafka_read import read_range, read_range_rows

    topic = new_topic(partitions=1)
    records = simple_records(30, base_ts=1_700_000_000_000, partitions=1)
    records[3] = (0, None, None, -1, [("msid", b"id-3")])  # no key, value or timestamp
    records[5] = (0, b"k5", b"v", 1_700_000_000_005, [("msid", b"old"), ("msid", b"id-5")])
    placed = produce(kafka_bootstrap, topic, records)
    options = {"bootstrap.servers": kafka_bootstrap, "topics": topic, "stream": "s"}
    if id_header:
        options["idHeader"] = id_header
    parsed = KafkaInjectorOptions.parse(options)
    part = KafkaRange(topic, 0, placed[0][1], placed[-1][1] + 1)
    arrow_rows = [row for batch in read_range(parsed, part) for row in _rows(batch)]
    driver_rows = [row for chunk in read_range_rows(parsed, part) for row in chunk]
    assert len(arrow_rows) == len(records)

    def clockless(row: tuple) -> tuple:  # a row without a timestamp gets the read's clock
        return (*row[:5], None, *row[6:]) if row[4] is None else row

    assert [clockless(r) for r in driver_rows] == [clockless(r) for r in arrow_rows]
    assert driver_rows[3][5] >= arrow_rows[3][5] > 0
    errors = [row[-1] for row in driver_rows]
    assert errors[3] is not None and "timestamp" in errors[3]
    if id_header:
        assert driver_rows[5][1] == b"id-5"
        assert "no 'msid' header" in (errors[1] or "")


def test_driver_batch_read_reads_partitions_at_once_with_the_rows_spark_reads(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """`read_batch` (the fused runtime's driver read) reads a batch's partitions at once, each
    with a consumer of its own: the rows are those Spark's tasks read, partition after
    partition in the batch's order, and a second batch continues where the first ended."""
    from millstream.connectors.driver_read import rows_of as _rows
    from millstream.injectors._kafka_options import KafkaInjectorOptions
    from millstream.injectors._kafka_read import read_range
    from millstream.injectors.kafka import batch_ranges, read_batch

    topic = new_topic(partitions=3)
    records = simple_records(60, base_ts=1_700_000_000_000, partitions=3)
    placed = produce(kafka_bootstrap, topic, records)
    ends = {p: max(o for q, o in placed if q == p) + 1 for p in range(3)}
    options = {"bootstrap.servers": kafka_bootstrap, "topics": topic, "stream": "s"}
    parsed = KafkaInjectorOptions.parse(options)

    def offset(positions: dict[int, int]) -> dict[str, Any]:
        return {"p": {f"{topic}:{p}": o for p, o in positions.items()}, "wm": [0, 0], "tick": 0}

    middle = {p: e // 2 for p, e in ends.items()}
    batches = [(offset({p: 0 for p in ends}), offset(middle)), (offset(middle), offset(ends))]
    read = []
    for start, end in batches:
        driver = [row for chunk in read_batch(options, start, end) for row in chunk]
        spark = [
            row
            for part in batch_ranges(start, end)
            for batch in read_range(parsed, part)
            for row in _rows(batch)
        ]
        assert driver == spark
        read.extend(driver)
    assert sorted((row[7], row[8]) for row in read) == sorted(placed)  # each record once


def test_caught_up_watermark_is_the_newest_records_time_not_now_minus_slack(
    kafka_bootstrap: str, redis_url: str, redis_namespace: str, new_topic: Callable[..., str]
) -> None:
    """A partition caught up at the batch's end offset is estimated from its newest record
    (the last one below the end), not from the idle policy alone: with records a few hundred
    ms old and a 60 s idle slack, the offset's "wm" (what commit publishes) is the minimum
    over partitions of each one's newest record. Partition 1 ends in a transaction's commit
    marker, so its last record lies below the last offset before the end."""
    from millstream.injectors.kafka import batch_ranges

    topic = new_topic(partitions=2)
    now = int(time.time() * 1000)
    plain = [(0, b"k%d" % i, b"v", now - 900 + 10 * i, None) for i in range(30)]  # to -610
    produce(kafka_bootstrap, topic, plain)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"t%d" % i, value=b"v", partition=1, timestamp=now - 700 + i)
    producer.commit_transaction(30)  # offsets 0-4 records, 5 the commit marker: the end is 6
    newest = {0: now - 900 + 290, 1: now - 700 + 4}
    expected = min(newest.values())

    source = KafkaInjector(
        {
            "bootstrap.servers": kafka_bootstrap,
            "topics": topic,
            "redis.url": redis_url,
            "app": redis_namespace,
            "instance": "a",
            "idleSlackMs": "60000",
        }
    )
    reader = source.streamReader(source.schema())
    authority = WatermarkAuthority(connect(redis_url), redis_namespace)
    try:
        start = reader.initialOffset()
        planned = time.time() * 1000
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end["p"] == {f"{topic}:0": 30, f"{topic}:1": 6}
        # Read the batch to its end: the rows' newest times per partition are the estimate's.
        rows = [
            row
            for part in batch_ranges(start, end)
            for batch in reader.read(part)
            for row in batch.to_pylist()
        ]
        read_newest = {p: max(r["timestamp"] for r in rows if r["partition"] == p) for p in (0, 1)}
        assert read_newest == newest
        assert end["wm"] == [expected, expected]
        assert expected > planned - 60_000 + 1_000  # not now - idleSlackMs
        reader.commit(end)
        assert authority.injector_stream(topic) == Watermark(expected, expected)

        # A later record on partition 0 leaves partition 1 (unchanged, its end cached) the min.
        produce(kafka_bootstrap, topic, [(0, b"late", b"v", now - 100, None)])
        later = reader.latestOffset(end, ReadAllAvailable())
        assert later["p"] == {f"{topic}:0": 31, f"{topic}:1": 6}
        assert later["wm"] == [expected, expected]
    finally:
        reader.stop()
        close_consumers()  # read() ran in this process and cached a consumer here


@pytest.mark.parametrize("starting", ["latest", "earliest"])
def test_a_restart_before_the_first_batch_commits_starts_where_the_first_start_did(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, starting: str
) -> None:
    """Spark asks a source for its initial offset again when the query restarts before batch
    0 committed, and reads batch 0 from that answer to the end it logged. From `latest` a
    second answer would start past records batch 0 was to read; with `startFile` (which
    `millstream run` sets in the checkpoint) the second reader gives the first answer."""
    topic = new_topic(partitions=1)
    produce(kafka_bootstrap, topic, [(0, b"k", b"v", 1_000 + i, None) for i in range(3)])
    options = {"bootstrap.servers": kafka_bootstrap, "topics": topic, "startingOffsets": starting}
    kept = {**options, "startFile": str(tmp_path / "checkpoint" / "starts" / "s.json")}

    def first_position(opts: dict[str, str]) -> int:
        source = KafkaInjector(opts)
        reader = source.streamReader(source.schema())
        try:
            return int(reader.initialOffset()["p"][f"{topic}:0"])
        finally:
            reader.stop()

    first = first_position(kept)
    assert first == (3 if starting == "latest" else 0)
    produce(kafka_bootstrap, topic, [(0, b"k", b"v", 2_000 + i, None) for i in range(3)])
    assert first_position(kept) == first  # the restarted query: the same start
    if starting == "latest":
        assert first_position(options) == 6  # without the file: past the first batch's records


def test_a_probe_brings_the_record_below_the_end_that_last_records_finds(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """The probe's fetch also carries the record just below the high watermark (`Peek.last`),
    which a caught-up partition's estimate needs: the same record `last_records` finds with a
    second round trip, so the planner can skip that trip. Ground truth: the producer's
    delivery reports and the timestamps it wrote."""
    from millstream.injectors._kafka_options import KafkaInjectorOptions
    from millstream.injectors._kafka_probe import PartitionProbe

    topic = new_topic(partitions=3)
    base = int(time.time() * 1000) - 60_000
    written = produce(
        kafka_bootstrap,
        topic,
        [(0, b"k", b"v%d" % i, base + i, None) for i in range(6)]
        + [(1, b"k", b"only", base + 100, None)],
    )
    assert sorted(written) == [(0, i) for i in range(6)] + [(1, 0)]
    options = KafkaInjectorOptions(bootstrap_servers=kafka_bootstrap, topics=(topic,), stream="s")
    probe = PartitionProbe(options)
    try:
        peeks = probe.probe({(topic, 0): 2, (topic, 1): 0, (topic, 2): 0}, drain=True)
        several, one, empty = peeks[(topic, 0)], peeks[(topic, 1)], peeks[(topic, 2)]
        assert (several.offset, several.high, several.timestamp) == (2, 6, base + 2)
        assert several.last is not None
        assert (several.last.offset, several.last.value, several.last.timestamp) == (
            5,
            b"v5",
            base + 5,
        )
        assert (one.offset, one.high) == (0, 1)
        assert one.last is not None and one.last.offset == 0 and one.last.value == b"only"
        assert (empty.offset, empty.high, empty.last) == (None, 0, None)
        # A probe at the end sees no record, so it brings no last record either.
        at_end = probe.probe({(topic, 0): 6})[(topic, 0)]
        assert (at_end.offset, at_end.high, at_end.last) == (None, 6, None)
        found = probe.last_records({(topic, 0): 6, (topic, 1): 1})
        assert (found[(topic, 0)].offset, found[(topic, 0)].value) == (5, b"v5")
        assert (found[(topic, 1)].offset, found[(topic, 1)].value) == (0, b"only")
    finally:
        probe.close()


def test_the_probes_escalated_fetch_wait_is_remembered_per_application_in_ms(
    redis_url: str, redis_namespace: str
) -> None:
    """A probe that escalated stores the wait (ms) in the application's Redis, so a restart
    starts there; a value that is no wait of the probe's (an index stored by older code, where
    2 meant 250 ms and 1 meant 25 ms) is read as unknown: the first wait, learned again."""
    from millstream.injectors import _kafka_probe
    from millstream.injectors._kafka_options import KafkaInjectorOptions
    from millstream.state.keys import app_key

    servers = "127.0.0.1:1"  # never contacted: the fetch below stands in for the broker
    options = KafkaInjectorOptions(
        bootstrap_servers=servers,
        topics=("t",),
        stream="s",
        app=redis_namespace,
        redis_url=redis_url,
    )
    key = app_key(redis_namespace, "probe-wait")
    client = connect(redis_url)
    before = _kafka_probe._wait_level
    try:
        _kafka_probe._wait_level = 0
        probe = _kafka_probe.PartitionProbe(options)

        def fetch(deadline: float) -> dict[Any, Any]:
            if _kafka_probe._wait_level == 0:  # the first wait's fetches go unanswered
                time.sleep(max(0.0, deadline - time.monotonic()))
                return {}
            return {("t", 0): "answer"}

        probe._answered({("t", 0): 0}, fetch)
        assert client.hget(key, servers) == b"250"
        _kafka_probe._wait_level = 0
        _kafka_probe.PartitionProbe(options)  # a restart
        assert _kafka_probe.FETCH_WAITS_MS[_kafka_probe._wait_level] == 250
        for stored in ("2", "1", "0", "garbage"):
            client.hset(key, servers, stored)
            _kafka_probe._wait_level = 0
            _kafka_probe.PartitionProbe(options)
            assert _kafka_probe._wait_level == 0, stored
    finally:
        _kafka_probe._wait_level = before
        client.delete(key)


def test_under_live_traffic_every_record_is_read_once_and_no_estimate_passes_one(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Batches planned every 100 ms while a producer writes about 2,000 records/s: a probe's
    fetch may end short of the high watermark it reports (the embedded broker's does in about
    a fifth of these probes), and the batch then ends after the newest record it brought
    (`_kafka_plan`). Whatever each batch's end, every record is read exactly once, and no
    estimate published before a batch passes a record of it: the producer stamps each record
    with its send time, so each partition's timestamps grow with its offsets (no out-of-order
    bound to allow). Ground truth: the producer's delivery reports and timestamps."""
    from millstream.injectors._kafka_options import KafkaInjectorOptions
    from millstream.injectors._kafka_plan import OffsetPlanner
    from millstream.injectors.kafka import read_batch

    topic = new_topic(partitions=2)
    options = KafkaInjectorOptions.parse(
        {"bootstrap.servers": kafka_bootstrap, "topics": topic, "idleSlackMs": "60000"}
    )
    planner = OffsetPlanner(options)
    placed: list[tuple[int, int]] = []
    failures: list[str] = []  # the writer's, checked here: an assert in its thread goes unseen
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 1})

        def done(err: Any, msg: Any) -> None:
            if err is None:
                placed.append((msg.partition(), msg.offset()))
            else:
                failures.append(f"delivery failed: {err}")

        while not stop.is_set():
            for i in range(10):
                producer.produce(topic, value=b"v" * 100, partition=i % 2, on_delivery=done)
            producer.poll(0)
            time.sleep(0.005)
        if producer.flush(30) != 0:
            failures.append("records still unsent after 30 s")

    writer = threading.Thread(target=write, daemon=True)
    batches = []
    try:
        start = planner.initial()
        writer.start()
        deadline = time.monotonic() + 3.0
        while True:
            done_writing = time.monotonic() > deadline
            if done_writing and not stop.is_set():
                stop.set()
                writer.join(30)
                assert not writer.is_alive() and not failures, failures
            end = planner.latest(start, None)
            if end is not None:
                batches.append((start, end))
                start = end
            if done_writing and sum(start.positions.values()) >= len(placed):
                break
            time.sleep(0.1)
        raw = {"bootstrap.servers": kafka_bootstrap, "topics": topic}
        read: list[tuple[int, int]] = []
        for begin, finish in batches:
            rows = [
                r for chunk in read_batch(raw, begin.to_json(), finish.to_json()) for r in chunk
            ]
            assert all(row[4] >= begin.watermark.event for row in rows), "a record made late"
            read += [(row[7], row[8]) for row in rows]
        assert len(placed) > 3_000 and len(batches) > 20
        assert sorted(read) == sorted(placed)  # every record once
    finally:
        stop.set()
        planner.close()
        close_consumers()
