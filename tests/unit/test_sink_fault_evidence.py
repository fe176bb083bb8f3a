"""The sink fault tests' evidence rules: what pins read_committed, what the journal says."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from millstream.testing.committed_reader import RawBatch
from tests.e2e.sink_faults import _open_transaction_before, acknowledged_offsets

COMMIT = 1


def data(offset: int, pid: int, created: int, transactional: bool = True) -> RawBatch:
    record = SimpleNamespace(offset=offset, value=b"{}", timestamp=created)
    return RawBatch(offset, offset + 1, pid, 0, transactional, False, (record,))


def marker(offset: int, pid: int) -> RawBatch:
    record = SimpleNamespace(offset=offset, type=COMMIT)
    return RawBatch(offset, offset + 1, pid, 0, True, True, (record,))


def test_the_earliest_unmarked_transaction_at_or_before_the_offset_is_the_blocker() -> None:
    batches = [
        data(0, 7, 100),
        marker(1, 7),
        data(2, 8, 200),  # never marked: pins the last stable offset from 2 on
        data(3, 7, 300),
        marker(4, 7),
        data(5, 9, 400),  # open too, but later
    ]
    assert _open_transaction_before(batches, 0) is None  # its transaction was committed
    assert _open_transaction_before(batches, 3) == (2, 8, 200)
    assert _open_transaction_before(batches, 5) == (2, 8, 200)
    assert _open_transaction_before(batches, 2) == (2, 8, 200)  # a record's own open txn counts


def test_non_transactional_records_never_block() -> None:
    assert _open_transaction_before([data(0, -1, 0, transactional=False)], 1) is None


def test_journal_keeps_only_acknowledged_writes(tmp_path: Path) -> None:
    journal = tmp_path / "deliveries.jsonl"
    rows = [
        {"e": "e1", "partition": 0, "offset": 5, "skipped": None},
        {"e": "e2", "partition": None, "offset": None, "skipped": "delivered"},
        {"e": "e3", "partition": 1, "offset": 9, "skipped": None},
    ]
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert acknowledged_offsets(journal) == {"e1": (0, 5), "e3": (1, 9)}
    assert acknowledged_offsets(tmp_path / "absent.jsonl") == {}
