"""Plain Spark baselines for `millstream bench`: `python -m millstream.bench.plain_spark CONFIG`.

Spark's own Kafka source needs a jar that cannot be fetched here, so both read with the
`millstream-kafka` data source (same offsets, same admission control, same trigger) and differ
from millstream only in their `foreachBatch`:

- `count`: the 1-second count the naive way. Each task sends one Redis `SET NX` per record id
  (pipelined, one round trip per task) and `HINCRBY`s the window counts of the ids that were
  new. No leases, no Bloom filters, no checkpointed productions, no output topic: not
  exactly-once under failures (a crash between the two round trips loses counts), which is
  what the baseline is for.
- `floor`: a trivial query that only notes, on the driver, when each record reaches
  `foreachBatch` (Spark's micro-batch latency floor; the record carries its send time):
  one line `<sent ms> <latency ms>` per record in `latency_file`.

Progress goes to Redis: `INCRBY <prefix>:records`, `INCR <prefix>:batches` after each batch.
With `warmup_topic` set, a first query counts that topic to its end before the measured one
starts (the millstream runs are measured warm too).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CLIENTS: dict[str, Any] = {}


def _client(url: str) -> Any:
    """One Redis connection per Python worker, reused across batches (workers are reused)."""
    client = _CLIENTS.get(url)
    if client is None:
        from millstream.state.client import connect

        client = _CLIENTS[url] = connect(url)
    return client


def count_partition(url: str, prefix: str, rows: Iterator[Any]) -> Iterator[int]:
    """One task: SET NX per record id, then HINCRBY per (window, query) of the new ones."""
    batch = list(rows)
    if not batch:
        yield 0
        return
    client = _client(url)
    pipe = client.pipeline(transaction=False)
    for row in batch:
        pipe.set(f"{prefix}:id:{row['id'].hex()}", b"1", nx=True, ex=3600)
    fresh = pipe.execute()
    counts: Counter[tuple[int, str]] = Counter()
    for row, new in zip(batch, fresh, strict=True):
        if new:
            ts = int(row["timestamp"])
            counts[(ts - ts % 1000, json.loads(row["value"])["q"])] += 1
    pipe = client.pipeline(transaction=False)
    for (window, query), n in counts.items():
        pipe.hincrby(f"{prefix}:w:{window}", query, n)
    pipe.execute()
    yield len(batch)


def main(argv: list[str]) -> int:
    import functools

    from millstream.connectors.spark_session import spark_session
    from millstream.settings import Settings

    config: dict[str, Any] = json.loads(Path(argv[1]).read_text())
    settings = Settings.from_env()
    url = str(config["redis_url"])
    prefix = str(config["prefix"])
    client = _client(url)
    spark = spark_session(settings, f"plain-{config['mode']}")

    def source(topic: str) -> Any:
        return (
            spark.readStream.format("millstream-kafka")
            .option("bootstrap.servers", str(config["bootstrap"]))
            .option("topics", topic)
            .option("idHeader", "event-id")
            .option("startingOffsets", "earliest")
            .option("tickMs", str(max(100, settings.trigger_ms)))
            .option("maxRecordsPerTrigger", str(settings.max_records_per_batch))
            .load()
        )

    frame = source(str(config["input_topic"]))
    latency_file = Path(str(config.get("latency_file", "latency.jsonl")))

    def count_batch(df: Any, batch_id: int) -> None:
        task = functools.partial(count_partition, url, prefix)
        rows = df.select("id", "value", "timestamp").rdd.mapPartitions(task).collect()
        pipe = client.pipeline(transaction=False)
        pipe.incrby(f"{prefix}:records", sum(rows))
        pipe.incr(f"{prefix}:batches")
        pipe.execute()

    def floor_batch(df: Any, batch_id: int) -> None:
        values = [row["value"] for row in df.select("value").collect()]
        seen = time.time_ns() // 1_000_000
        if values:
            with latency_file.open("a") as out:
                for value in values:
                    sent = int(json.loads(value)["sent"])
                    out.write(f"{sent} {seen - sent}\n")
        pipe = client.pipeline(transaction=False)
        pipe.incrby(f"{prefix}:records", len(values))
        pipe.incr(f"{prefix}:batches")
        pipe.execute()

    if config.get("warmup_topic"):  # warm the JVM and Python workers, as millstream's runs are
        warm_prefix = f"{prefix}:warmup"

        def warm_batch(df: Any, batch_id: int) -> None:
            task = functools.partial(count_partition, url, warm_prefix)
            df.select("id", "value", "timestamp").rdd.mapPartitions(task).collect()

        (
            source(str(config["warmup_topic"]))
            .writeStream.foreachBatch(warm_batch)
            .option("checkpointLocation", str(config["checkpoint"]) + "-warmup")
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
    query = (
        frame.writeStream.queryName(f"plain-{config['mode']}")
        .foreachBatch(count_batch if config["mode"] == "count" else floor_batch)
        .option("checkpointLocation", str(config["checkpoint"]))
        .trigger(processingTime=f"{settings.trigger_ms} milliseconds")
        .start()
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
    return 0


if __name__ == "__main__":
    # Import this file under its package name so Spark pickles the task function by reference
    # (and its worker-side Redis connection cache works), not by value from __main__.
    from millstream.bench.plain_spark import main as _main

    sys.exit(_main(sys.argv))
