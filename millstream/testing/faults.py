"""Fault injectors for exactly-once tests: crash, pause, restart, duplicate, delay.

Each injector does to a real process or service what a real failure would: SIGKILL leaves no
shutdown hook, SIGSTOP makes a process a zombie that wakes up later believing it still owns its
work, a restarted Redis or broker drops every connection. Use them in your own tests with
`PipelineProcess` (your pipeline in a session of its own: `kill9()`, `pause()`, `resume()`) and
the `millstream.testing` fixtures;
`millstream chaos` runs them on a random, seeded schedule.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from millstream.testing._crash import session_members
from millstream.testing.process import PipelineProcess

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "PipelineProcess",
    "SentRecord",
    "duplicate_delivery",
    "fault_schedule",
    "kill_python_worker",
    "pause_python_worker",
    "restart_service",
    "spark_python_workers",
]

FAULT_KINDS = (
    "kill-pipeline",  # SIGKILL of driver, JVM and Python workers at once, then a restart
    "kill-worker",  # SIGKILL of one Spark Python worker mid-task
    "pause-worker",  # SIGSTOP of one Spark Python worker, SIGCONT later: a zombie wakes up
    "pause-pipeline",  # SIGSTOP of the whole pipeline (a long GC pause), SIGCONT later
    "restart-redis",  # SIGKILL of redis-server, restarted from its append-only file
    "restart-broker",  # SIGKILL of the broker, restarted on its durable storage
    "broker-outage",  # every broker connection cut and refused for a while (a TcpProxy)
    "duplicate",  # records already sent are sent again with the same ids
    "delay",  # the input stops for a while, then arrives in a burst
    "rescale",  # `millstream rescale` of the counting stage to another shard count, while it runs
)


# --------------------------------------------------------------------- process tree


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, command line) of a live process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return ppid, cmdline


def spark_python_workers(session: int) -> list[int]:
    """Spark Python workers of a pipeline's session: processes forked by a `pyspark.daemon`."""
    workers = []
    for pid in session_members(session):
        info = _proc_stat(pid)
        if info is None or "pyspark.daemon" not in info[1]:
            continue
        parent = _proc_stat(info[0])
        if parent is not None and "pyspark.daemon" in parent[1]:
            workers.append(pid)
    return workers


def kill_python_worker(session: int, rng: random.Random) -> int | None:
    """SIGKILL one Spark Python worker (its task fails; the query replays the batch)."""
    workers = spark_python_workers(session)
    if not workers:
        return None
    victim = rng.choice(workers)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)
    return victim


def pause_python_worker(session: int, seconds: float, rng: random.Random) -> int | None:
    """SIGSTOP one Spark Python worker for `seconds`, then SIGCONT: it wakes up as a zombie."""
    workers = spark_python_workers(session)
    if not workers:
        return None
    victim = rng.choice(workers)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGSTOP)
    timer = threading.Timer(seconds, _cont, args=(victim,))
    timer.daemon = True
    timer.start()
    return victim


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def restart_service(service: Any, down_seconds: float = 1.0) -> None:
    """SIGKILL an embedded Redis or broker, keep it down a while, start it on the same port.

    Works with `millstream.embedded` services (`durable_redis`, `durable_kafka` fixtures), whose
    storage survives the crash: Redis' append-only file (fsync always), Tansu's S3 bucket.
    """
    service.kill9()
    time.sleep(down_seconds)
    service.restart()


def duplicate_delivery(kafka: dict[str, str], topic: str, records: Sequence[SentRecord]) -> int:
    """Send `records` again, byte for byte, ids included: what a retrying upstream does."""
    from confluent_kafka import Producer

    producer = Producer({**kafka, "enable.idempotence": True, "linger.ms": 5})
    for record in records:
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            timestamp=record.timestamp_ms,
            headers=list(record.headers),
        )
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} duplicate records were not acknowledged by Kafka")
    return len(records)


@dataclass(frozen=True)
class SentRecord:
    """One input record as it was sent, so a fault can send it again unchanged."""

    key: bytes
    value: bytes
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()


# --------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Fault:
    """One planned fault: what, when (seconds after traffic starts) and for how long."""

    at_s: float
    kind: str
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


def fault_schedule(
    seed: int, duration_s: float, kinds: Sequence[str] = FAULT_KINDS, every_s: float = 20.0
) -> list[Fault]:
    """A reproducible schedule: every kind once in a seeded order, then seeded random picks.

    Faults start after a quiet first interval and stop one interval before the end, so the
    pipeline is seen working before the first fault and recovering after the last.
    """
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; choose from {', '.join(FAULT_KINDS)}")
    if not kinds:
        return []
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out: list[Fault] = []
    at = every_s
    while at <= duration_s - every_s or (not out and at <= duration_s):
        kind = order[len(out)] if len(out) < len(order) else rng.choice(list(kinds))
        seconds = {
            "pause-worker": 8.0,
            "pause-pipeline": 6.0,
            "delay": 5.0,
            "broker-outage": 5.0,
        }.get(kind, 1.0)
        out.append(Fault(round(at, 1), kind, seconds))
        at += every_s * rng.uniform(0.8, 1.2)
    return out
