"""Soak: the transactional sink alone while its durable broker is stopped and restarted.

    python -m tests.e2e.soak_sink_restart --runs 10

No Spark, no Redis: a loop plays the runtime's part (two shards, five new productions per shard
and round, a failed delivery keeps its productions for the next round, as checkpoints do) against
a private Tansu on local S3, which gets SIGTERM at a random moment and comes back after
`--down` seconds. Afterwards the marker-aware reader must see every production exactly once.
A run that misses productions prints their raw batches and the next marker of their producer,
to tell a sink defect from a broker's. Each run takes about 30 s. This is how the figures of
issue #6 were measured (the doubles before commits in doubt were resumed; 2 of 36 runs after,
with records under an ABORT marker although the broker acknowledged their commit).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from millstream.embedded import start_kafka_durable
from millstream.records import Production
from millstream.sinks.base import ShardRef
from millstream.sinks.kafka_transactional import KafkaTransactionalSink
from millstream.testing.committed_reader import aborted_values, read_committed, read_raw
from millstream.testing.infra import create_topic

SHARDS = 2
PER_ROUND = 5


def one_run(seed: int, down_s: float, workdir: Path) -> dict[str, object]:
    rng = random.Random(seed)
    broker = start_kafka_durable(workdir)
    try:
        topic = create_topic(broker.bootstrap, partitions=2)
        sink = KafkaTransactionalSink(
            {"bootstrap.servers": broker.bootstrap}, topic, delivery_timeout_s=3.0,
            transaction_timeout_ms=10_000,
        )  # fmt: skip
        sink.setup()
        pending: dict[int, list[Production]] = {s: [] for s in range(SHARDS)}
        seqs: collections.Counter[int] = collections.Counter()
        sent, failures = 0, 0
        stop_at = 3 + rng.random() * 3
        began = time.monotonic()
        stopped_at: float | None = None
        restarted = False
        while True:
            now = time.monotonic() - began
            if stopped_at is None and now > stop_at:
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGTERM)
                stopped_at = time.monotonic()
            if stopped_at is not None and not restarted and time.monotonic() - stopped_at >= down_s:
                broker.restart()
                restarted = True
            if now < stop_at + down_s + 10:
                for shard in range(SHARDS):
                    for _ in range(PER_ROUND):
                        seqs[shard] += 1
                        value = f"e{sent}".encode()
                        sent += 1
                        pending[shard].append(
                            Production("s", f"k{shard}", value, int(time.time() * 1000), value,
                                       int(time.time() * 1000), seqs[shard])
                        )  # fmt: skip
            elif not any(pending.values()) or now > stop_at + down_s + 90:
                break
            for shard in range(SHARDS):
                if pending[shard]:
                    batch = list(pending[shard])
                    try:
                        sink.deliver(ShardRef("soak", "sink", shard), batch)
                        pending[shard] = pending[shard][len(batch) :]
                    except Exception:
                        failures += 1
            time.sleep(0.05)
        seen = collections.Counter(r.value for r in read_committed(broker.bootstrap, topic))
        expected = {f"e{i}".encode() for i in range(sent)}
        missing = sorted(expected - set(seen))
        aborted: set[bytes] = set()
        for partition in range(2):
            aborted |= set(aborted_values(read_raw(broker.bootstrap, topic, partition)[0]))
        return {
            "seed": seed,
            "sent": sent,
            "failed_deliveries": failures,
            "undelivered": sum(len(p) for p in pending.values()),
            "doubled": sorted(v.decode() for v, n in seen.items() if n > 1),
            "missing": [v.decode() for v in missing],
            "missing_under_abort_marker": bool(missing) and set(missing) <= aborted,
        }
    finally:
        broker.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--down", type=float, default=5.0, help="seconds the broker stays down")
    args = parser.parse_args(argv)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="millstream-soak-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.runs):
            result = one_run(seed, args.down, Path(tmp) / f"run{seed}")
            ok = not result["doubled"] and not result["missing"] and not result["undelivered"]
            bad += not ok
            print(("ok  " if ok else "BAD ") + str(result), flush=True)
    print(f"{args.runs - bad} of {args.runs} runs exactly once", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
