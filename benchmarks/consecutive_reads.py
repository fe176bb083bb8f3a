"""The Kafka injector's driver read and probe over a pre-loaded topic, batch after batch.

What a pipeline catching up on a backlog does: each batch reads the next range of every
partition (`_kafka_read.read_range_rows`, one thread per partition, consumers kept warm between
batches) and probes the partitions at the batch's end (`_kafka_probe.PartitionProbe.probe`).
Two settings are run interleaved over the same topic, round after round:

* `librdkafka`: librdkafka's defaults for the fetch queue (`queued.min.messages` 100,000,
  `fetch.queue.backoff.ms` 1,000): once a consumer's queue holds more than that, librdkafka
  pauses its fetches for 1 s, and a warm consumer carries the pause into its next read;
* `bounded`: the injector's settings (a reader queues `_kafka_read.QUEUED_RECORDS`, a probe
  `_kafka_probe.PROBE_QUEUE`, and both pause 10 ms).

Printed per round: each batch's read time (p50 / p95 / max, and how many took 0.9 s or more),
the probes' (p50 / max), the fetch-wait escalations the pauses set off, and the CPU seconds
of this process and of the broker (when it runs on this machine).

    python benchmarks/consecutive_reads.py [--records 400000] [--per-partition 5000] [--rounds 2]

Uses KAFKA_BOOTSTRAP_SERVERS, or starts the embedded broker (and Redis) when it is unset.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from millstream.bench._broker_load import cpu_seconds, listening_pid
from millstream.bench._workload import PARTITIONS, new_topic, preload
from millstream.embedded import embedded_services
from millstream.injectors import _kafka_probe, _kafka_read
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors.kafka import options_from_settings
from millstream.settings import Settings

SETTINGS = {
    "librdkafka": {"queued": 100_000, "probe_queued": 100_000, "backoff_ms": 1000},
    "bounded": {
        "queued": _kafka_read.QUEUED_RECORDS,
        "probe_queued": _kafka_probe.PROBE_QUEUE,
        "backoff_ms": _kafka_read.QUEUE_BACKOFF_MS,
    },
}


def use(name: str) -> None:
    """Apply one setting to both modules, with fresh consumers and no escalation."""
    chosen = SETTINGS[name]
    _kafka_read.close_consumers()
    _kafka_read.QUEUED_RECORDS = chosen["queued"]
    _kafka_read.QUEUE_BACKOFF_MS = chosen["backoff_ms"]
    _kafka_probe.PROBE_QUEUE = chosen["probe_queued"]
    _kafka_probe.QUEUE_BACKOFF_MS = chosen["backoff_ms"]
    _kafka_read._wait_level = 0
    _kafka_probe._wait_level = 0


def ends_of(options: KafkaInjectorOptions) -> list[int]:
    """Each partition's end, from a fetch (the broker's ListOffsets may be wrong, see the
    README's broker defects)."""
    probe = _kafka_probe.PartitionProbe(options)
    try:
        found = probe.probe(dict.fromkeys(probe.partitions(), _kafka_probe.EARLIEST))
    finally:
        probe.close()
    return [peek.high for _, peek in sorted(found.items())]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered):.3f} p95 {p95:.3f} max {ordered[-1]:.3f} s"


def one_round(
    options: KafkaInjectorOptions, topic: str, ends: list[int], per: int, broker: int | None
) -> dict[str, Any]:
    """Every batch: read each partition's next `per` records at once, then probe the ends."""
    pool = ThreadPoolExecutor(PARTITIONS)
    probe = _kafka_probe.PartitionProbe(options)
    reads: list[float] = []
    probes: list[float] = []
    rows = 0
    cpu0 = time.process_time()
    broker0 = cpu_seconds(broker) if broker is not None else None
    started = time.monotonic()
    for batch in range(-(-max(ends) // per)):
        parts = [
            _kafka_read.KafkaRange(topic, p, batch * per, min(ends[p], (batch + 1) * per))
            for p in range(PARTITIONS)
            if ends[p] > batch * per
        ]
        t0 = time.monotonic()
        got = pool.map(lambda r: sum(map(len, _kafka_read.read_range_rows(options, r))), parts)
        rows += sum(got)
        reads.append(time.monotonic() - t0)
        t0 = time.monotonic()
        probe.probe({(r.topic, r.partition): r.end for r in parts})
        probes.append(time.monotonic() - t0)
    probe.close()
    pool.shutdown()
    broker1 = cpu_seconds(broker) if broker is not None else None
    broker_s = broker1 - broker0 if broker1 is not None and broker0 is not None else None
    return {
        "rows": rows,
        "wall_s": time.monotonic() - started,
        "reads": reads,
        "probes": probes,
        "read_level": _kafka_read._wait_level,
        "probe_level": _kafka_probe._wait_level,
        "client_cpu_s": time.process_time() - cpu0,
        "broker_cpu_s": broker_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--per-partition", type=int, default=5000, help="records per batch")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each setting")
    args = parser.parse_args()
    settings = Settings.from_env()
    with embedded_services(settings, Path(settings.state_dir) / "embedded") as (_, bootstrap):
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
        topic = new_topic({"bootstrap.servers": bootstrap}, "consecutive-reads")
        preload({"bootstrap.servers": bootstrap}, topic, args.records)
        options = KafkaInjectorOptions.parse(
            options_from_settings(Settings.from_env(), topic, stream="events")
        )
        ends = ends_of(options)
        broker = listening_pid(bootstrap)
        print(
            f"{args.records} records in {PARTITIONS} partitions (ends {ends}), "
            f"{args.per_partition} per partition and batch; load {os.getloadavg()[0]:.2f}"
        )
        for round_ in range(args.rounds):
            for name in SETTINGS:
                use(name)
                found = one_round(options, topic, ends, args.per_partition, broker)
                slow = sum(1 for s in found["reads"] if s >= 0.9)
                broker_cpu = found["broker_cpu_s"]
                print(
                    f"round {round_} {name:>10}: {found['rows']} rows in {found['wall_s']:.2f} s; "
                    f"reads {spread(found['reads'])} ({slow} of {len(found['reads'])} >= 0.9 s); "
                    f"probes {spread(found['probes'])}; escalated: read {found['read_level']}, "
                    f"probe {found['probe_level']}; cpu: client {found['client_cpu_s']:.2f} s, "
                    + ("broker -" if broker_cpu is None else f"broker {broker_cpu:.2f} s")
                )
        use("bounded")


if __name__ == "__main__":
    main()
