"""The raw reader steps over a log hole when asked to, recording it, instead of raising: a test
hit by the broker's hole can then still check everything the broker does serve."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecordsBuilder

from millstream.testing import committed_reader
from millstream.testing.committed_reader import LogHole, LogHoleError, _fetch_all


def records_at(offset: int) -> bytes:
    builder = MemoryRecordsBuilder(2, 0, 1 << 16)
    builder.append(0, None, f"v{offset}".encode(), [])
    builder.close()
    # A v2 batch starts with its base offset (outside the CRC): move the batch there.
    return offset.to_bytes(8, "big") + bytes(builder.buffer())[8:]


class FakeBroker:
    """Serves one record at each offset of `present` below the high watermark `high`."""

    def __init__(self, present: set[int], high: int) -> None:
        self.present, self.high = present, high

    def version(self, cls: Any, name: str) -> int:
        return 11

    def request(self, request: Any) -> Any:
        at = request.topics[0].partitions[0].fetch_offset
        data = records_at(at) if at in self.present else b""
        part = SimpleNamespace(error_code=0, records=data, high_watermark=self.high)
        return SimpleNamespace(responses=[SimpleNamespace(partitions=[part])])


def test_a_hole_raises_unless_holes_are_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committed_reader, "_LONG_WAIT_MS", 0)
    broker = FakeBroker({0, 1, 4, 5}, high=6)  # offsets 2 and 3 are gone
    with pytest.raises(LogHoleError):
        _fetch_all(broker, "t", 0, timeout=0.05)  # type: ignore[arg-type]
    holes: list[LogHole] = []
    batches, high = _fetch_all(broker, "t", 0, timeout=0.05, holes=holes)  # type: ignore[arg-type]
    assert [b.base_offset for b in batches] == [0, 1, 4, 5] and high == 6
    assert holes == [LogHole("t", 0, 2, 4)] and holes[0].size == 2


def test_a_hole_at_the_end_of_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    holes: list[LogHole] = []
    batches, _ = _fetch_all(FakeBroker({0}, high=3), "t", 0, timeout=0.05, holes=holes)  # type: ignore[arg-type]
    assert [b.base_offset for b in batches] == [0] and holes == [LogHole("t", 0, 1, 3)]
