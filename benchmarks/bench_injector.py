"""Kafka injector throughput and per-batch overhead, against Spark's built-in sources.

    .venv/bin/python benchmarks/bench_injector.py [--records 1000000] [--seconds 15]

1. Per-batch overhead: an empty topic with `tickMs=1` (so every trigger is a new, empty
   batch) under `processingTime=0`, against `rate-micro-batch` with one row per batch; both
   into the same Python foreachBatch that counts the rows. Reported: median ms per batch.
2. Throughput: N pre-loaded 100-byte records read with `Trigger.AvailableNow` into the same
   foreachBatch, against `rate-micro-batch` producing the same number of rows.

Uses KAFKA_BOOTSTRAP_SERVERS when set, else starts an embedded Tansu broker (and stops it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from millstream.embedded import HOST, start_kafka
from millstream.injectors.kafka import KafkaInjector


def spark_session(workdir: Path) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    from pyspark.sql import SparkSession

    builder: Any = SparkSession.builder
    return (
        builder.master("local[2]")
        .appName("bench-injector")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.host", HOST)
        .config("spark.driver.bindAddress", HOST)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(workdir / "local"))
        .getOrCreate()
    )


def create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})])
    futures[topic].result(30)
    return topic


def preload(bootstrap: str, topic: str, records: int, value_bytes: int, partitions: int) -> float:
    """Write `records` records of `value_bytes` bytes; returns records/s of the producer."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    value = b"x" * value_bytes
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return records / (time.perf_counter() - started)


class Counter:
    """The foreachBatch both sources share: count rows, remember when each batch ended."""

    def __init__(self) -> None:
        self.rows = 0
        self.ends: list[float] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        self.rows += df.count()
        self.ends.append(time.perf_counter())


def per_batch_ms(
    spark: Any, reader: Any, checkpoint: str, seconds: float
) -> tuple[float, int, str]:
    """Median wall ms between consecutive batches, after three warm-up batches."""
    counter = Counter()
    query = (
        reader.load()
        .writeStream.foreachBatch(counter)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        # Measure for `seconds` after three warm-up batches (query start is slow), 2 min at most.
        deadline = time.monotonic() + 120
        warm_at: float | None = None
        while time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
            if warm_at is None and len(counter.ends) >= 3:
                warm_at = time.monotonic()
            if warm_at is not None and time.monotonic() - warm_at >= seconds:
                break
        if query.exception() is not None:
            raise RuntimeError(query.exception())
    finally:
        query.stop()
    gaps = [b - a for a, b in zip(counter.ends[3:], counter.ends[4:], strict=False)]
    if not gaps:
        raise RuntimeError(f"too few batches ran: {len(counter.ends)}")
    return statistics.median(gaps) * 1000, len(counter.ends), phases(query.recentProgress[3:])


def phases(progress: list[Any]) -> str:
    """Median ms of Spark's per-phase durations, the biggest first."""
    keys = {k for p in progress for k in p["durationMs"]}
    medians = {k: statistics.median(p["durationMs"].get(k, 0) for p in progress) for k in keys}
    top = sorted(medians.items(), key=lambda kv: -kv[1])[:6]
    return ", ".join(f"{k} {v:.0f}" for k, v in top)


def drain(spark: Any, reader: Any, checkpoint: str, expected: int) -> tuple[float, float, int]:
    """(records/s over the wall time, records/s over batch time, batches) for one run."""
    counter = Counter()
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.foreachBatch(counter)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    wall = time.perf_counter() - started
    if counter.rows != expected:
        raise RuntimeError(f"counted {counter.rows} rows, expected {expected}")
    batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
    return counter.rows / wall, counter.rows / max(batch_ms / 1000, 1e-9), len(counter.ends)


def drain_rate(spark: Any, checkpoint: str, total: int, per_batch: int) -> tuple[float, float]:
    """rate-micro-batch has no end: run it until `total` rows were counted."""
    counter = Counter()
    started = time.perf_counter()
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_batch)
        .option("numPartitions", 2)
        .load()
        .writeStream.foreachBatch(counter)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while counter.rows < total and query.isActive:
            time.sleep(0.05)
    finally:
        query.stop()
    wall = time.perf_counter() - started
    batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
    return counter.rows / wall, counter.rows / max(batch_ms / 1000, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-per-trigger", type=int, default=0, help="0: no limit")
    parser.add_argument("--seconds", type=float, default=10.0, help="per overhead run")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-injector-"))
    kafka = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        kafka = start_kafka(work / "kafka")
        bootstrap = kafka.bootstrap
    spark = None
    try:
        spark = spark_session(work)
        spark.dataSource.register(KafkaInjector)

        def injector(topic: str, **extra: str) -> Any:
            options = {"bootstrap.servers": bootstrap, "topics": topic, **extra}
            return spark.readStream.format("millstream-kafka").options(**options)

        # 1. Per-batch overhead: empty batches.
        empty = create_topic(bootstrap, args.partitions)
        kafka_ms, kafka_batches, kafka_phases = per_batch_ms(
            spark, injector(empty, tickMs="1"), str(work / "cp-empty"), args.seconds
        )
        rate_reader = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1)
        rate_ms, rate_batches, rate_phases = per_batch_ms(
            spark, rate_reader, str(work / "cp-rate-empty"), args.seconds
        )
        print(f"per-batch overhead: millstream-kafka (empty topic) {kafka_ms:.1f} ms "
              f"({kafka_batches} batches); rate-micro-batch (1 row) {rate_ms:.1f} ms "
              f"({rate_batches} batches); ratio {kafka_ms / rate_ms:.2f}x")  # fmt: skip
        print(f"  millstream-kafka phases (median ms): {kafka_phases}")
        print(f"  rate-micro-batch phases (median ms): {rate_phases}")

        # 2. Throughput.
        topic = create_topic(bootstrap, args.partitions)
        produced = preload(bootstrap, topic, args.records, args.value_bytes, args.partitions)
        print(f"preloaded {args.records} x {args.value_bytes} B records at {produced:,.0f}/s")
        extra = {"maxRecordsPerTrigger": str(args.max_per_trigger)} if args.max_per_trigger else {}
        wall_rps, batch_rps, batches = drain(
            spark, injector(topic, **extra), str(work / "cp-drain"), args.records
        )
        per_batch = args.max_per_trigger or args.records
        rate_wall, rate_batch = drain_rate(
            spark, str(work / "cp-rate"), args.records, min(per_batch, args.records)
        )
        print(f"throughput: millstream-kafka {wall_rps:,.0f} records/s wall "
              f"({batch_rps:,.0f}/s inside {batches} batches); rate-micro-batch "
              f"{rate_wall:,.0f} rows/s wall ({rate_batch:,.0f}/s inside batches); "
              f"ratio {wall_rps / rate_wall:.2f}x")  # fmt: skip
    finally:
        if spark is not None:
            from millstream.testing.infra import stop_spark_session

            stop_spark_session(spark)
        if kafka is not None:
            kafka.stop()


if __name__ == "__main__":
    main()
