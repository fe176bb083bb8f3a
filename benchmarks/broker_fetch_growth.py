"""Does the broker answer fetches more slowly as a partition grows? A check without millstream.

The bench's generator (`RateProducer`: events at a fixed rate, sent every 5 ms, so record
batches of one or two records) writes into a fresh topic while one plain confluent-kafka
consumer does what any reader of new records does, every 0.2 s: assign each partition at the
offset after its last record read, read until the end of every partition (PARTITION_EOF),
unassign. Printed every 5 s: the broker process's CPU (when it runs on this machine) and the
median time of those reads. On Apache Kafka a fetch finds its offset through the segment's
index, so neither figure should grow with the topic.

    python benchmarks/broker_fetch_growth.py [--rate 1000] [--seconds 60] [--no-reader]

`--no-reader` is the control: the same writes, nobody reading.

Uses KAFKA_BOOTSTRAP_SERVERS, or starts the embedded broker (and Redis) when it is unset.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from millstream.bench._broker_load import CpuSeries, listening_pid, per_window
from millstream.bench._workload import PARTITIONS, RateProducer, new_topic
from millstream.embedded import embedded_services
from millstream.settings import Settings

READ_EVERY_S = 0.2
READ_TIMEOUT_S = 2.0


def reader(
    bootstrap: str, topic: str, halt: threading.Event, reads: list[tuple[int, float]]
) -> None:
    """Every READ_EVERY_S, the partitions' new records up to their end; (start ms, seconds)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "broker-fetch-growth",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    positions = dict.fromkeys(range(PARTITIONS), 0)
    while not halt.is_set():
        started = time.time()
        consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
        ended: set[int] = set()
        while len(ended) < PARTITIONS and time.time() - started < READ_TIMEOUT_S:
            for message in consumer.consume(1000, 0.05):
                if message.error() is not None:
                    ended.add(message.partition())
                else:
                    positions[message.partition()] = message.offset() + 1
        consumer.unassign()
        reads.append((int(started * 1000), time.time() - started))
        time.sleep(READ_EVERY_S)
    consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--no-reader", action="store_true", help="the control: writes only")
    args = parser.parse_args()
    settings = Settings.from_env()
    with embedded_services(settings, Path(settings.state_dir) / "embedded") as (_, bootstrap):
        kafka = {"bootstrap.servers": bootstrap}
        topic = new_topic(kafka, "fetch-growth")
        pid = listening_pid(bootstrap)
        broker = CpuSeries(pid) if pid is not None else None
        halt = threading.Event()
        reads: list[tuple[int, float]] = []
        thread = threading.Thread(target=reader, args=(bootstrap, topic, halt, reads), daemon=True)
        producer = RateProducer(kafka, topic, args.rate, args.seconds)
        start = int(time.time() * 1000)
        producer.start()
        if not args.no_reader:
            thread.start()
        if broker is not None:
            broker.start()
        print(
            f"{args.rate:.0f} events/s into {topic} ({PARTITIONS} partitions) on {bootstrap}"
            + (", no reader (the control)" if args.no_reader else "")
        )
        shown = start
        while producer.is_alive():
            producer.join(5.0)
            now = int(time.time() * 1000)
            if now - shown < 1000:
                continue  # the writes just ended
            window = (now - shown) / 1000
            read = per_window(reads, shown, now, window, statistics.median)[0]
            cores = (
                per_window(broker.samples, shown, now, window, statistics.fmean)[0]
                if broker
                else None
            )
            print(
                f"t={(now - start) / 1000:5.1f}s sent={producer.sent:7d} read p50="
                + ("-" if read is None else f"{read * 1000:.0f} ms")
                + " broker CPU="
                + (
                    "not on this machine"
                    if broker is None
                    else "-"
                    if cores is None
                    else f"{cores:.2f} cores"
                ),
                flush=True,
            )
            shown = now
        halt.set()
        if thread.is_alive():
            thread.join(READ_TIMEOUT_S + 1)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
