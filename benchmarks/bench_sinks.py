"""Sink throughput and delivery-to-visibility latency.

    python benchmarks/bench_sinks.py [--records 20000] [--batch 1000] [--rounds 40]

Uses KAFKA_BOOTSTRAP_SERVERS / REDIS_URL when set, else starts an embedded Tansu and
redis-server (and stops them). Figures:

- throughput: productions per second through `deliver()` in batches of `--batch`, per mode;
- latency: from the `deliver()` call until a reader sees the whole batch:
  * kafka-transactional: the marker-aware read_committed view (Apache Kafka semantics) and a
    plain confluent-kafka read_committed consumer;
  * kafka-stream: a plain consumer (read_uncommitted);
  * redis / file: the write is visible when `deliver()` returns.

On Tansu a Fetch waiting for data returns on a ~250 ms broker tick, which floors the consumer
latencies; the marker-aware figure polls the raw log and is not subject to that tick.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from millstream.records import Production
from millstream.sinks import (
    FileSink,
    KafkaStreamSink,
    KafkaTransactionalSink,
    RedisSink,
    ShardRef,
    Sink,
)
from millstream.sinks.dedup_reader import message_id
from millstream.testing.committed_reader import read_committed
from millstream.testing.infra import create_topic


def productions(first: int, n: int, size: int = 100) -> list[Production]:
    now = int(time.time() * 1000)
    payload = b"x" * size
    return [
        Production("out", f"k{s % 64}", payload, now, uuid.uuid4().bytes, now, seq=s)
        for s in range(first, first + n)
    ]


def percentiles(samples: list[float]) -> str:
    if not samples:
        return "n/a"
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return (
        f"p50 {at(0.50):7.1f} ms  p95 {at(0.95):7.1f} ms  p99 {at(0.99):7.1f} ms  "
        f"(n={len(samples)}, mean {statistics.mean(samples) * 1000:.1f} ms)"
    )


def throughput(sink: Sink, app: str, records: int, batch: int) -> float:
    shard = ShardRef(app, "bench", 0)
    sink.deliver(shard, productions(0, 10))  # warm-up: clients, init_transactions
    start = time.perf_counter()
    seq = 10
    while seq < records + 10:
        sink.deliver(shard, productions(seq, batch))
        seq += batch
    return records / (time.perf_counter() - start)


class Watcher:
    """A plain consumer in a thread, noting when each production id first arrives."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        self.seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.05):
                rid = message_id(msg) if msg.error() is None else None
                if rid is not None:
                    self.seen.setdefault(rid, time.perf_counter())

    def wait_for(self, ids: list[bytes], timeout: float = 10.0) -> float | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(i in self.seen for i in ids):
                return max(self.seen[i] for i in ids)
            time.sleep(0.002)
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def kafka_latency(
    sink: Sink, app: str, bootstrap: str, topic: str, rounds: int, batch: int, marker_aware: bool
) -> tuple[list[float], list[float]]:
    """(plain-consumer latencies, marker-aware latencies) per batch."""
    shard = ShardRef(app, "bench-latency", 0)
    isolation = "read_committed" if marker_aware else "read_uncommitted"
    watcher = Watcher(bootstrap, topic, isolation)
    plain: list[float] = []
    aware: list[float] = []
    try:
        sink.deliver(shard, productions(0, 1))
        for r in range(rounds):
            items = productions(1 + r * batch, batch)
            ids = [p.id for p in items]
            start = time.perf_counter()
            sink.deliver(shard, items)
            if marker_aware:
                wanted = set(ids)
                while True:
                    got = {rec.header("ms-id") for rec in read_committed(bootstrap, topic)}
                    if wanted <= got:
                        aware.append(time.perf_counter() - start)
                        break
            seen_at = watcher.wait_for(ids)
            if seen_at is not None:
                plain.append(seen_at - start)
    finally:
        watcher.close()
    return plain, aware


def local_latency(
    sink: Sink, app: str, rounds: int, batch: int, visible: Callable[[], bool]
) -> list[float]:
    shard = ShardRef(app, "bench-latency", 0)
    out = []
    for r in range(rounds):
        items = productions(r * batch, batch)
        start = time.perf_counter()
        sink.deliver(shard, items)
        assert visible()
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--latency-batch", type=int, default=50)
    args = parser.parse_args()

    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sinks-")))
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        redis_url = os.environ.get("REDIS_URL")
        if not bootstrap or not redis_url:
            from millstream.embedded import start_kafka, start_redis

            if not bootstrap:
                kafka = start_kafka(workdir / "kafka")
                stack.callback(kafka.stop)
                bootstrap = kafka.bootstrap
            if not redis_url:
                redis_service = start_redis(workdir / "redis")
                stack.callback(redis_service.stop)
                redis_url = redis_service.url
        conf = {"bootstrap.servers": bootstrap}
        app = f"bench{uuid.uuid4().hex[:8]}"
        print(f"kafka {bootstrap}  redis {redis_url}  records {args.records}  batch {args.batch}")

        modes: list[tuple[str, Callable[[str], Sink]]] = [
            ("kafka-stream (idempotent)", lambda t: KafkaStreamSink(conf, t)),
            ("kafka-transactional", lambda t: KafkaTransactionalSink(conf, t)),
        ]
        print("\nthroughput (100-byte values, one shard)")
        for name, make in modes:
            topic = create_topic(bootstrap, partitions=1)
            sink = make(topic)
            sink.setup()
            rate = throughput(sink, app, args.records, args.batch)
            sink.close()
            print(f"  {name:28s} {rate:10,.0f} productions/s")
        redis_sink = RedisSink(redis_url, prefix=f"{app}:")
        redis_sink.setup()
        print(
            f"  {'redis (Lua upsert)':28s} {throughput(redis_sink, app, args.records, args.batch):10,.0f} productions/s"
        )
        file_sink = FileSink(workdir / "files")
        file_sink.setup()
        print(
            f"  {'file (fsync + rename)':28s} {throughput(file_sink, app, args.records, args.batch):10,.0f} productions/s"
        )

        print(
            f"\nlatency, deliver() call -> batch of {args.latency_batch} visible, {args.rounds} rounds"
        )
        topic = create_topic(bootstrap, partitions=1)
        txn = KafkaTransactionalSink(conf, topic)
        txn.setup()
        plain, aware = kafka_latency(
            txn, app, bootstrap, topic, args.rounds, args.latency_batch, True
        )
        txn.close()
        print(f"  {'transactional, marker-aware':34s} {percentiles(aware)}")
        print(f"  {'transactional, read_committed':34s} {percentiles(plain)}")
        topic = create_topic(bootstrap, partitions=1)
        stream = KafkaStreamSink(conf, topic)
        stream.setup()
        plain, _ = kafka_latency(
            stream, app, bootstrap, topic, args.rounds, args.latency_batch, False
        )
        stream.close()
        print(f"  {'stream, consumer':34s} {percentiles(plain)}")
        lat = local_latency(redis_sink, app, args.rounds, args.latency_batch, lambda: True)
        print(f"  {'redis, deliver returns':34s} {percentiles(lat)}")
        lat = local_latency(file_sink, app + "x", args.rounds, args.latency_batch, lambda: True)
        print(f"  {'file, deliver returns':34s} {percentiles(lat)}")
        redis_sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
