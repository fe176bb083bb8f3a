"""How long a dropped fetch may stall an injector before it moves to a longer fetch wait.

A broker that drops short fetches (the embedded one, under load) held every stage's watermark
for 3 s per drop; the bench's multi-second stalls came from it. The policy is pure: the probe's
`_answered` takes the fetch as a callable, and a reader's escalation is a module-level level.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from millstream.injectors import _kafka_probe, _kafka_read
from millstream.injectors._kafka_options import KafkaInjectorOptions

OPTIONS = KafkaInjectorOptions(bootstrap_servers="127.0.0.1:1", topics=("t",), stream="s")
TP = ("t", 0)


@pytest.fixture(autouse=True)
def _levels() -> Iterator[None]:
    probe, read = _kafka_probe._wait_level, _kafka_read._wait_level
    _kafka_probe._wait_level = _kafka_read._wait_level = 0
    yield
    _kafka_probe._wait_level, _kafka_read._wait_level = probe, read


def test_the_probe_starts_at_25_ms_and_escalates_once_when_a_fetch_goes_unanswered() -> None:
    """25 ms from the start: the embedded broker drops 1 ms fetches under live traffic, and
    the escalation's patience was a mid-traffic stall of every pipeline (see `_kafka_probe`)."""
    probe = _kafka_probe.PartitionProbe(OPTIONS)
    waits: list[int] = []

    def fetch(deadline: float) -> dict[Any, Any]:
        """A broker that never answers a 25 ms fetch and answers a 250 ms one at once."""
        waits.append(_kafka_probe.FETCH_WAITS_MS[_kafka_probe._wait_level])
        if _kafka_probe._wait_level == 0:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return {}
        return {TP: "answer"}

    started = time.monotonic()
    assert probe._answered({TP: 0}, fetch) == {TP: "answer"}
    stalled = time.monotonic() - started
    assert waits == [25, 250]
    assert _kafka_probe._wait_level == 1
    patience = _kafka_probe.ESCALATE_AFTER_S[0]
    assert patience - 0.05 <= stalled < patience + 0.5, stalled


def test_every_escalation_step_has_its_patience() -> None:
    assert len(_kafka_probe.ESCALATE_AFTER_S) == len(_kafka_probe.FETCH_WAITS_MS) - 1
    assert len(_kafka_read.ESCALATE_AFTER_S) == len(_kafka_read.READ_WAITS_MS) - 1


def test_reads_stalled_together_escalate_the_fetch_wait_one_step() -> None:
    """Two partitions' reads that waited at 10 ms both escalate: the wait becomes 100 ms, not
    500 ms (seen in a chaos run: one broker hiccup, 10 -> 500 ms for the rest of the run)."""
    built = [_kafka_read._consumer(OPTIONS) for _ in range(2)]
    seen = [_kafka_read._level_of(key) for key, _ in built]
    assert seen == [0, 0]
    out: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda c=consumer, s=level: out.append(
                _kafka_read._escalate(OPTIONS, c, "t:0 [0, 1)", s)
            )
        )
        for (_, consumer), level in zip(built, seen, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _kafka_read._wait_level == 1
    assert [_kafka_read._level_of(key) for key, _ in out] == [1, 1]
    for _, consumer in out:
        consumer.close()


def _built_config(monkeypatch: pytest.MonkeyPatch, module: Any, build: Any) -> dict[str, Any]:
    """The librdkafka configuration `build()` creates its consumer from."""
    seen: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, config: dict[str, Any]) -> None:
            seen.append(config)

    monkeypatch.setattr(module, "Consumer", Recorder)
    build()
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("which", ["reader", "probe"])
def test_consumers_never_queue_into_librdkafkas_one_second_fetch_pause(
    monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """Past `queued.min.messages` queued records librdkafka stops fetching for
    `fetch.queue.backoff.ms` (100,000 and 1 s by default), and a warm consumer carries the
    pause into its next assignment: over a pre-loaded topic a fifth of the driver's reads took
    1 s and probes 1.0-1.7 s, each taken for a slow broker (benchmarks/consecutive_reads.py).
    Both consumers queue about what one call takes and pause for milliseconds."""
    monkeypatch.setattr(_kafka_read, "_IDLE", {})
    if which == "reader":
        config = _built_config(monkeypatch, _kafka_read, lambda: _kafka_read._consumer(OPTIONS))
        largest_call = _kafka_read.CONSUME_CHUNK
    else:
        probe = _kafka_probe.PartitionProbe(OPTIONS)
        config = _built_config(monkeypatch, _kafka_probe, probe._client)
        largest_call = 1000  # _fetch_once takes up to 1000 events a call
    assert config["queued.min.messages"] <= largest_call < 100_000
    assert config["fetch.queue.backoff.ms"] <= 10
