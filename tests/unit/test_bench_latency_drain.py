"""The latency drain's delivery check: the live watcher's count, or a whole marker-aware read
once that count stands still short (the live watcher missed a transaction on the embedded
broker while every output was on the topic)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from millstream.bench import latency


def test_a_stalled_short_watcher_is_checked_by_a_whole_read(monkeypatch: Any) -> None:
    clock = [100.0]
    reads: list[str] = []
    monkeypatch.setattr(latency.time, "monotonic", lambda: clock[0])

    def count(bootstrap: str, topic: str) -> int:
        reads.append(topic)
        return 10

    monkeypatch.setattr(latency, "committed_count", count)
    watcher = SimpleNamespace(count=8)
    delivered = latency._Delivered("b:1", {"p": "out"}, {"p": watcher}, total=10)
    assert not delivered("p")  # short, just seen
    clock[0] += latency._Delivered.RECOUNT_S - 0.1
    assert not delivered("p") and reads == []  # not still for long enough
    clock[0] += 0.2
    assert delivered("p") and reads == ["out"]  # the whole read finds every output


def test_a_short_whole_read_is_not_taken_for_delivery_and_a_moving_watcher_is_not_recounted(
    monkeypatch: Any,
) -> None:
    clock = [0.0]
    reads: list[str] = []
    monkeypatch.setattr(latency.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(latency, "committed_count", lambda b, t: reads.append(t) or 9)
    watcher = SimpleNamespace(count=0)
    delivered = latency._Delivered("b:1", {"p": "out"}, {"p": watcher}, total=10)
    for _ in range(9):  # the live count keeps moving: no whole read
        clock[0] += 1.0
        watcher.count += 1
        assert not delivered("p")
    assert reads == []
    clock[0] += latency._Delivered.RECOUNT_S + 1
    assert not delivered("p") and reads == ["out"]  # 9 of 10 on the topic too: not delivered
    watcher.count = 10
    assert delivered("p")


@pytest.mark.parametrize("seen, read, note", [(10, 10, ""), (8, 10, "2 unsampled")])
def test_the_report_names_outputs_the_watcher_never_saw(seen: int, read: int, note: str) -> None:
    run = {"seen": {"p": seen}, "committed_reader_count": {"p": read}}
    found = {"records_pipeline": run, "records_no_eo_pipeline": {"seen": {}}}
    text = latency._missed_by_watchers(found)
    assert (note in text) if note else text == ""
