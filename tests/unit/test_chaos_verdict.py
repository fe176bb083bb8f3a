"""The chaos run's verdict: every figure it measures can fail it, the plain consumer and
unexpected pipeline exits included."""

from __future__ import annotations

import json
from typing import Any

from millstream.chaos.run import failed_checks, plain_consumer_verdict
from millstream.testing.committed_reader import PlainView, RecordOrigin

LEAK = RecordOrigin(0, 3, 7, 0, "ABORT", b"{}")


def clean() -> dict[str, Any]:
    return {
        "losses": 0,
        "duplicates_out": 0,
        "unexpected_out": 0,
        "verdict": "exactly once",
        "state_mismatches": {},
        "numbering_errors": [],
        "recovery_s": {"not_recovered": 0},
        "plain_read_committed_consumer": {"verdict": "exact", "detail": ""},
        "unexpected_pipeline_exits": 0,
    }


def test_a_clean_run_passes() -> None:
    assert failed_checks(clean()) == []


def test_unexpected_pipeline_exits_fail_the_run() -> None:
    summary = {**clean(), "unexpected_pipeline_exits": 1}
    assert failed_checks(summary) == ["1 unexpected pipeline exits (at most 0 allowed)"]
    assert failed_checks(summary, max_unexpected_exits=1) == []


def test_the_plain_consumer_passes_only_exact_or_on_proven_leaks() -> None:
    assert plain_consumer_verdict(PlainView([], [], []), broker_leaks=False)["verdict"] == "exact"
    leak = PlainView([LEAK], [], [])
    assert plain_consumer_verdict(leak, broker_leaks=True)["verdict"] == "broker defect"
    assert plain_consumer_verdict(leak, broker_leaks=False)["verdict"] == "wrong"
    withheld = PlainView([LEAK], [], [(0, 5)])
    assert plain_consumer_verdict(withheld, broker_leaks=True)["verdict"] == "wrong"
    # Withheld records pass only on the broker's own contradiction (withheld_by_broker).
    proven = "p0: last stable offset 0, no open transaction, log end 9"
    assert plain_consumer_verdict(withheld, True, proven)["verdict"] == "broker defect"
    assert plain_consumer_verdict(withheld, False, proven)["verdict"] == "wrong"
    unexplained = PlainView([LEAK], ["p0@4: under ABORT of the live producer"], [])
    assert plain_consumer_verdict(unexplained, broker_leaks=True)["verdict"] == "wrong"
    summary = {**clean(), "plain_read_committed_consumer": {"verdict": "wrong", "detail": "x"}}
    assert failed_checks(summary) == ["a plain read_committed consumer: x"]
    defect = {
        **clean(),
        "plain_read_committed_consumer": {"verdict": "broker defect", "detail": ""},
    }
    assert failed_checks(defect) == []


def test_every_exactly_once_figure_fails_the_run() -> None:
    assert failed_checks({**clean(), "losses": 2})
    assert failed_checks({**clean(), "duplicates_out": 1})
    assert failed_checks({**clean(), "state_mismatches": {"k": {"state": 1, "truth": 2}}})
    assert failed_checks({**clean(), "numbering_errors": ["k"]})
    assert failed_checks({**clean(), "recovery_s": {"not_recovered": 1}})


def test_duplicate_copies_name_each_raw_copy_with_its_epoch_and_closing_marker() -> None:
    from types import SimpleNamespace

    from millstream.chaos.run import duplicate_copies
    from millstream.testing.committed_reader import RawBatch

    def data(offset: int, epoch: int, output_id: str) -> RawBatch:
        value = json.dumps({"id": output_id, "k": "k1", "n": 1}).encode()
        record = SimpleNamespace(offset=offset, key=None, value=value, timestamp=0, headers=[])
        return RawBatch(offset, offset + 1, 4, epoch, True, False, (record,))

    def commit(offset: int, epoch: int) -> RawBatch:
        return RawBatch(
            offset, offset + 1, 4, epoch, True, True, (SimpleNamespace(offset=offset, type=1),)
        )

    # Epoch 0's copy has no marker of its own: epoch 1's COMMIT closes both.
    log = [[data(0, 0, "a"), data(1, 1, "a"), data(2, 1, "b"), commit(3, 1)]]
    assert duplicate_copies(log, ["a"]) == [
        "a p0@0 pid 4 epoch 0 COMMIT",
        "a p0@1 pid 4 epoch 1 COMMIT",
    ]
    assert duplicate_copies(log, []) == []
