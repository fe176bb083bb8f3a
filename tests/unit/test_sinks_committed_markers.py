"""How the marker-aware reader turns raw batches into Apache Kafka's read_committed view."""

from __future__ import annotations

from types import SimpleNamespace

from millstream.testing.committed_reader import RawBatch, aborted_values, apply_markers

COMMIT, ABORT = 1, 0


def data(offset: int, pid: int, value: bytes, transactional: bool = True) -> RawBatch:
    record = SimpleNamespace(offset=offset, key=None, value=value, timestamp=0, headers=[])
    return RawBatch(offset, offset + 1, pid, 0, transactional, False, (record,))


def marker(offset: int, pid: int, kind: int) -> RawBatch:
    return RawBatch(
        offset, offset + 1, pid, 0, True, True, (SimpleNamespace(offset=offset, type=kind),)
    )


def values(batches: list[RawBatch]) -> list[bytes | None]:
    return [r.value for r in apply_markers("t", 0, batches)]


def test_commit_abort_and_plain_records() -> None:
    batches = [
        data(0, -1, b"plain", transactional=False),
        data(1, 7, b"a1"),
        data(2, 8, b"b1"),
        data(3, 7, b"a2"),
        marker(4, 8, ABORT),
        marker(5, 7, COMMIT),
        data(6, 7, b"a3"),
        marker(7, 7, ABORT),
    ]
    assert values(batches) == [b"plain", b"a1", b"a2"]


def test_open_transaction_holds_back_everything_after_it() -> None:
    batches = [
        data(0, 7, b"a1"),
        marker(1, 7, COMMIT),
        data(2, 8, b"open"),
        data(3, -1, b"plain-after", transactional=False),
        data(4, 7, b"a2"),
        marker(5, 7, COMMIT),
    ]
    assert values(batches) == [b"a1"]
    assert values([*batches, marker(6, 8, ABORT)]) == [b"a1", b"plain-after", b"a2"]


def test_markers_of_another_producer_do_not_apply() -> None:
    assert values([data(0, 7, b"x"), marker(1, 9, COMMIT)]) == []


def test_aborted_values_are_those_an_abort_marker_closed() -> None:
    batches = [
        data(0, 7, b"a1"),
        data(1, 8, b"b1"),
        marker(2, 7, COMMIT),
        data(3, 7, b"a2"),
        data(4, -1, b"plain", transactional=False),
        marker(5, 8, ABORT),
        marker(6, 7, ABORT),
        data(7, 7, b"open"),
    ]
    assert aborted_values(batches) == [b"b1", b"a2"]
