"""The sink fault tests' evidence rules, on canned raw batches: an expected failure (a broker
defect) only on positive evidence, and every look-alike a product defect could leave is refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from millstream.testing.committed_reader import (
    PlainView,
    RawBatch,
    judge_plain_view,
    listed_aborted_but_committed,
    withheld_by_broker,
)
from millstream.testing.txn_wire import OffsetAnswer, TxnCall, TxnWireLog
from tests.e2e.sink_faults import (
    ACKED_THEN_ABORTED_REASON,
    LOST_COMMIT_REASON,
    SPLIT_OUTCOME_REASON,
    STUCK_TXN_REASON,
    TXN_TIMEOUT_S,
    UNSERVED_ACK_REASON,
    WATCHER_CLIENT,
    _open_transaction_before,
    acked_commit_unapplied_progress_evidence,
    acknowledged_offsets,
    acknowledged_then_aborted,
    journal_productions,
    lost_commit_evidence,
    reinit_unapplied_progress_evidence,
    split_outcome_evidence,
    unapplied_progress_evidence,
    unserved_ack_evidence,
)

COMMIT, ABORT = 1, 0
WAITED = TXN_TIMEOUT_S + 5


def data(
    offset: int,
    pid: int,
    created: int = 0,
    transactional: bool = True,
    event: str | None = None,
    epoch: int = 0,
) -> RawBatch:
    value = json.dumps({"e": event, "k": "k0", "n": 1}).encode() if event else b"{}"
    record = SimpleNamespace(offset=offset, key=None, value=value, timestamp=created, headers=[])
    return RawBatch(offset, offset + 1, pid, epoch, transactional, False, (record,))


def marker(offset: int, pid: int, kind: int = COMMIT, epoch: int = 0) -> RawBatch:
    record = SimpleNamespace(offset=offset, type=kind)
    return RawBatch(offset, offset + 1, pid, epoch, True, True, (record,))


# ---------------------------------------------------------------- lost commit


def aborted_log() -> list[list[RawBatch]]:
    """p0: e1 committed, then e2 and e3 written by the same producer and aborted."""
    return [
        [
            data(0, 7, event="e1"),
            marker(1, 7, COMMIT),
            data(2, 7, event="e2"),
            data(3, 7, event="e3"),
            marker(4, 7, ABORT),
        ]
    ]


NAMES = {"e1": {(0, 4)}, "e2": {(0, 5)}, "e3": {(0, 6)}}
# The broker's progress of shard 0: 5 after e1's transaction, 7 after e2-e3's (their top seq
# 6, + 1), 9 after a later one; seen on the way and now.
SEEN = {0: {5, 7, 9}}
NOW = {0: 9}


def test_lost_commit_needs_the_brokers_progress_at_the_aborted_transaction() -> None:
    evidence = lost_commit_evidence(["e2", "e3"], [], aborted_log(), NAMES, NOW, SEEN)
    assert evidence is not None and "seq 5: progress 9 now, 7 seen" in evidence, evidence
    assert LOST_COMMIT_REASON.startswith("broker defect")


def test_missing_records_without_covering_progress_are_not_the_brokers() -> None:
    # The broker's progress now stops below seq 6: it never counted e3 as delivered.
    assert lost_commit_evidence(["e2", "e3"], [], aborted_log(), NAMES, {0: 6}, SEEN) is None
    # No progress at all for the shard (a negative offset: the group never committed).
    assert lost_commit_evidence(["e3"], [], aborted_log(), NAMES, {0: -1001}, SEEN) is None
    assert lost_commit_evidence(["e3"], [], aborted_log(), NAMES, {}, SEEN) is None


def test_progress_covering_only_through_a_later_commit_is_not_the_brokers() -> None:
    # A sink that took the aborted commit for done and delivered on leaves the same log and a
    # final progress past the lost seqs; only a value at the lost transaction proves the broker
    # committed its offsets. Seen 5 and 9 (never 7): refused.
    assert lost_commit_evidence(["e2", "e3"], [], aborted_log(), NAMES, NOW, {0: {5, 9}}) is None
    assert lost_commit_evidence(["e2", "e3"], [], aborted_log(), NAMES, NOW, {}) is None
    # A value at a lower lost seq does not cover a higher one.
    assert lost_commit_evidence(["e2", "e3"], [], aborted_log(), NAMES, NOW, {0: {6}}) is None


def test_lost_commit_refuses_the_other_look_alikes() -> None:
    # A checkpoint still in Redis: the sink knows it has not delivered.
    assert lost_commit_evidence(["e2"], [object()], aborted_log(), NAMES, NOW, SEEN) is None
    # Never written at all, or under COMMIT (then a reader problem), or with no marker yet.
    never = [[data(0, 7, event="e1"), marker(1, 7, COMMIT)]]
    assert lost_commit_evidence(["e2"], [], never, NAMES, NOW, SEEN) is None
    committed = [[data(0, 7, event="e2"), marker(1, 7, COMMIT)]]
    assert lost_commit_evidence(["e2"], [], committed, NAMES, NOW, SEEN) is None
    open_txn = [[data(0, 7, event="e2")]]
    assert lost_commit_evidence(["e2"], [], open_txn, NAMES, NOW, SEEN) is None
    # A production nobody can name (not in the journal), or two productions for one input.
    assert lost_commit_evidence(["e2"], [], aborted_log(), {}, NOW, SEEN) is None
    twice = {**NAMES, "e2": {(0, 5), (1, 1)}}
    assert lost_commit_evidence(["e2", "e3"], [], aborted_log(), twice, NOW, SEEN) is None


# ---------------------------------------------------------------- acknowledged, then aborted

TOPIC = "out"


def add(at: float, pid: int = 7, epoch: int = 0, error: int = 0) -> TxnCall:
    return TxnCall("add_partitions", "t", pid, epoch, at, None, ((TOPIC, 0),), error, at + 0.01)


def end(at: float, commit: bool, error: int | None = 0, pid: int = 7, epoch: int = 0) -> TxnCall:
    answered = None if error is None else at + 0.01
    return TxnCall("end_txn", "t", pid, epoch, at, commit, (), error, answered)


def wire_of(*calls: TxnCall) -> TxnWireLog:
    wire = TxnWireLog()
    wire._calls.extend(calls)
    return wire


def test_a_commit_answered_with_success_then_aborted_is_the_brokers() -> None:
    # e1's transaction (the 1st of pid 7 in p0) committed; e2-e3's (the 2nd) was committed on
    # the wire after one unanswered try, yet its marker is ABORT.
    wire = wire_of(add(1.0), end(2.0, True), add(3.0), end(4.0, True, None), end(5.0, True))
    evidence = acknowledged_then_aborted(["e2", "e3"], TOPIC, aborted_log(), wire)
    assert evidence is not None and evidence.startswith("2 records"), evidence
    assert "p0@2 pid 7 epoch 0: EndTxn(commit) sent 5.000" in evidence
    assert ACKED_THEN_ABORTED_REASON.startswith("broker defect")


def test_an_abort_asked_for_or_an_end_never_answered_is_not_the_brokers() -> None:
    asked = wire_of(add(1.0), end(2.0, True), add(3.0), end(4.0, False))
    assert acknowledged_then_aborted(["e2"], TOPIC, aborted_log(), asked) is None
    # The commit never answered, and a new transaction began: the re-init aborted it, rightly.
    unanswered = wire_of(add(1.0), end(2.0, True), add(3.0), end(4.0, True, None), add(6.0))
    assert acknowledged_then_aborted(["e2"], TOPIC, aborted_log(), unanswered) is None


def split_log() -> list[list[RawBatch]]:
    """One transaction of pid 7 wrote e1 to p0 and e2 to p1: COMMIT in p0, ABORT in p1."""
    return [
        [data(0, 7, event="e1"), marker(1, 7, COMMIT)],
        [data(0, 7, event="e2"), marker(1, 7, ABORT)],
    ]


def add_both(at: float) -> TxnCall:
    return TxnCall("add_partitions", "t", 7, 0, at, None, ((TOPIC, 0), (TOPIC, 1)), 0, at + 0.01)


SPLIT_NAMES = {"e1": {(0, 4)}, "e2": {(0, 5)}}


def test_one_transaction_committed_in_one_partition_and_aborted_in_another_is_the_brokers() -> None:
    # Its commit went unanswered (the broker stopped), then was retried: one transaction.
    wire = wire_of(add_both(1.0), end(2.0, True, None), end(3.0, True, None))
    evidence = split_outcome_evidence(["e2"], TOPIC, split_log(), wire, SPLIT_NAMES, {0: 6})
    assert evidence is not None and "p1@0 ABORT, and p0@0 COMMIT" in evidence, evidence
    assert SPLIT_OUTCOME_REASON.startswith("broker defect")


def test_a_split_outcome_needs_one_transaction_on_the_wire_and_the_brokers_progress() -> None:
    log = split_log()
    wire = wire_of(add_both(1.0), end(2.0, True, None))
    # Two transactions on the wire (p0's ended before p1's began): each had one outcome.
    add_p1 = TxnCall("add_partitions", "t", 7, 0, 3.0, None, ((TOPIC, 1),), 0, 3.01)
    two = wire_of(add(1.0), end(2.0, True), add_p1, end(4.0, False))
    assert split_outcome_evidence(["e2"], TOPIC, log, two, SPLIT_NAMES, {0: 6}) is None
    # The broker's progress does not cover seq 5: the sink did not skip it on the broker's word.
    assert split_outcome_evidence(["e2"], TOPIC, log, wire, SPLIT_NAMES, {0: 5}) is None
    # Unnamed, under COMMIT itself, or a wire log with parse errors.
    assert split_outcome_evidence(["e2"], TOPIC, log, wire, {}, {0: 6}) is None
    assert split_outcome_evidence(["e1"], TOPIC, log, wire, SPLIT_NAMES, {0: 6}) is None
    wire.errors.append("response api 26 v3: unpack requires a buffer of 2 bytes")
    assert split_outcome_evidence(["e2"], TOPIC, log, wire, SPLIT_NAMES, {0: 6}) is None


def test_acknowledged_then_aborted_refuses_what_it_cannot_match() -> None:
    log = aborted_log()
    # The wire saw one transaction of pid 7 where the log holds two: no match.
    assert acknowledged_then_aborted(["e2"], TOPIC, log, wire_of(add(1.0), end(2.0, True))) is None
    # Another epoch on the wire than in the log.
    other = wire_of(add(1.0), end(2.0, True), add(3.0, epoch=1), end(4.0, True, epoch=1))
    assert acknowledged_then_aborted(["e2"], TOPIC, log, other) is None
    # A record under COMMIT, or not in the log at all, is not this defect.
    good = wire_of(add(1.0), end(2.0, True), add(3.0), end(4.0, True))
    assert acknowledged_then_aborted(["e1"], TOPIC, log, good) is None
    assert acknowledged_then_aborted(["e9"], TOPIC, log, good) is None
    # A wire log with parse errors proves nothing.
    good.errors.append("response api 26 v3: unpack requires a buffer of 2 bytes")
    assert acknowledged_then_aborted(["e2"], TOPIC, log, good) is None


def test_journal_names_productions_written_or_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "deliveries.jsonl"
    rows = [
        {"e": "e1", "shard": 0, "seq": 4, "partition": 0, "offset": 5, "skipped": None},
        {"e": "e1", "shard": 0, "seq": 4, "partition": None, "offset": None, "skipped": "x"},
        {"e": "e2", "shard": 1, "seq": 2, "partition": None, "offset": None, "skipped": "x"},
    ]
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert journal_productions(journal) == {"e1": {(0, 4)}, "e2": {(1, 2)}}
    assert journal_productions(tmp_path / "absent.jsonl") == {}


# ---------------------------------------------------------------- committed, then delivered again


def delivered_twice_log(first: int = COMMIT) -> list[list[RawBatch]]:
    """p0: producer 5 epoch 2 wrote e1 (its transaction ended by `first`), epoch 3 wrote it
    again and committed."""
    return [
        [
            data(0, 5, event="e1", epoch=2),
            marker(1, 5, first, epoch=2),
            data(2, 5, event="e1", epoch=3),
            marker(3, 5, COMMIT, epoch=3),
        ]
    ]


def twice_journal(tmp_path: Path, seqs: tuple[int, int] = (4, 4)) -> Path:
    journal = tmp_path / "deliveries.jsonl"
    rows = [
        {"e": "e1", "shard": 0, "seq": seqs[0], "partition": 0, "offset": 0, "skipped": None,
         "t": 10.0},
        {"e": "e1", "shard": 0, "seq": seqs[1], "partition": 0, "offset": 2, "skipped": None,
         "t": 30.0},
    ]  # fmt: skip
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return journal


def test_progress_answered_stale_after_a_committed_transaction_is_the_brokers(
    tmp_path: Path,
) -> None:
    # Progress 5 (seq 4 delivered) at 10.5, then the old 4 ("seq 4 not delivered") at 15.
    timeline = {0: [(9.0, 4), (10.5, 5), (15.0, 4), (31.0, 5)]}
    evidence = unapplied_progress_evidence(
        ["e1"], twice_journal(tmp_path), delivered_twice_log(), timeline
    )
    assert evidence is not None and "shard 0 seq 4" in evidence and "COMMIT" in evidence


def test_delivered_again_is_ours_without_each_broker_fact(tmp_path: Path) -> None:
    stale = {0: [(15.0, 4)]}
    journal = twice_journal(tmp_path)
    # The broker aborted the first copy: the second delivery was right.
    assert unapplied_progress_evidence(["e1"], journal, delivered_twice_log(ABORT), stale) is None
    # The broker always answered "delivered" between the two (or only before the first
    # delivery returned, or too soon after it): the sink delivered again on its own.
    for timeline in ({0: [(15.0, 5)]}, {0: [(9.0, 4), (10.4, 4)]}, {0: [(31.0, 4)]}, {}):
        assert unapplied_progress_evidence(["e1"], journal, delivered_twice_log(), timeline) is None
    # Two productions for one input: a recomputation, ours whatever the broker said.
    other = twice_journal(tmp_path, seqs=(4, 9))
    assert unapplied_progress_evidence(["e1"], other, delivered_twice_log(), stale) is None
    # An event the journal never delivered twice proves nothing.
    assert unapplied_progress_evidence(["e2"], journal, delivered_twice_log(), stale) is None


def timed_out_commit(
    tmp_path: Path, commit: bool = True, shard: int = 0
) -> tuple[Path, TxnWireLog]:
    """The sink's view of delivered_twice_log: the first commit timed out (the journal has only
    the second delivery, at 30.0); the wire saw epoch 2's transaction start and its EndTxn."""
    journal = tmp_path / "deliveries.jsonl"
    row = {"e": "e1", "shard": 0, "seq": 4, "partition": 0, "offset": 2, "skipped": None,
           "t": 30.0}  # fmt: skip
    journal.write_text(json.dumps(row) + "\n")
    txn_id = f"millstream.app.relay.{shard}"
    start = TxnCall("add_partitions", txn_id, 5, 2, 9.0, None, ((TOPIC, 0),), 0, 9.01)
    ended = TxnCall("end_txn", txn_id, 5, 2, 9.5, commit, (), 0, 9.51)
    return journal, wire_of(start, progress_sent(shard), ended)


def progress_sent(shard: int = 0, offset: int = 5, epoch: int = 2, at: float = 9.2) -> TxnCall:
    """Epoch `epoch` of producer 5 commits shard `shard`'s progress `offset` (seq 4 + 1)."""
    return TxnCall(
        "txn_offsets", f"millstream.app.relay.{shard}", 5, epoch, at, None,
        (("__millstream_progress", 0),), 0, at + 0.01,
        group=f"millstream.progress.app.relay.{shard}.out",
        offsets=(("__millstream_progress", 0, offset),),
    )  # fmt: skip


def test_a_timed_out_commit_committed_while_progress_stayed_old_is_the_brokers(
    tmp_path: Path,
) -> None:
    journal, wire = timed_out_commit(tmp_path)
    evidence = acked_commit_unapplied_progress_evidence(
        ["e1"], TOPIC, journal, delivered_twice_log(), wire, {0: [(12.0, 4)]}
    )
    assert evidence is not None and "EndTxn(commit) answered 9.510" in evidence


def test_a_timed_out_commit_delivered_again_is_ours_without_each_broker_fact(
    tmp_path: Path,
) -> None:
    journal, wire = timed_out_commit(tmp_path)
    stale = {0: [(12.0, 4)]}

    def judge(log: list[list[RawBatch]], w: TxnWireLog, timeline: dict) -> str | None:
        return acked_commit_unapplied_progress_evidence(["e1"], TOPIC, journal, log, w, timeline)

    assert judge(delivered_twice_log(ABORT), wire, stale) is None  # the broker aborted it
    assert judge(delivered_twice_log(), timed_out_commit(tmp_path, commit=False)[1], stale) is None
    assert judge(delivered_twice_log(), timed_out_commit(tmp_path, shard=1)[1], stale) is None
    assert judge(delivered_twice_log(), wire_of(), stale) is None  # no answer on the wire
    # The transaction's progress commit not on the wire: the records alone were committed.
    no_progress = wire_of(*(c for c in wire.calls() if c.api != "txn_offsets"))
    assert judge(delivered_twice_log(), no_progress, stale) is None
    late = wire_of(*no_progress.calls(), progress_sent(at=9.6))  # after the EndTxn: another's
    assert judge(delivered_twice_log(), late, stale) is None
    # Progress said "delivered", or "not delivered" only before the answer settled or after
    # the second delivery: the sink delivered again on its own.
    for timeline in ({0: [(12.0, 5)]}, {0: [(10.0, 4)]}, {0: [(31.0, 4)]}, {}):
        assert judge(delivered_twice_log(), wire, timeline) is None
    # A second copy with other bytes is another production (a recomputation): ours.
    recomputed = delivered_twice_log()
    again = recomputed[0][2].records[0]
    recomputed[0][2] = RawBatch(2, 3, 5, 3, True, False, (SimpleNamespace(
        offset=2, key=None, value=again.value.replace(b'"n": 1', b'"n": 2'), timestamp=0,
        headers=[]),))  # fmt: skip
    assert judge(recomputed, wire, stale) is None
    broken = wire_of(*wire.calls())
    broken.errors.append("unparsed")
    assert judge(delivered_twice_log(), broken, stale) is None


def unanswered_commit_then_reinit(
    tmp_path: Path,
    init_epoch: int = 3,
    init_error: int | None = 0,
    shard: int = 0,
    commit: bool = True,
    init_pid: int = 5,
    init_at: float = 20.0,
    offsets: tuple[TxnCall, ...] | None = None,
    late_end: bool = False,
) -> tuple[Path, TxnWireLog]:
    """The sink's view of delivered_twice_log when epoch 2's commit was never answered: the
    wire saw its start, its progress commit and its EndTxn (no answer), then the shard's
    InitProducerId answered at `init_at` (19.0 + 1) with epoch `init_epoch`; the journal has
    only the second delivery, at 30.0."""
    journal, _ = timed_out_commit(tmp_path)
    txn_id = f"millstream.app.relay.{shard}"
    start = TxnCall("add_partitions", txn_id, 5, 2, 9.0, None, ((TOPIC, 0),), 0, 9.01)
    ended = TxnCall("end_txn", txn_id, 5, 2, 9.5, commit, (), None, None)
    answered = None if init_error is None else init_at
    init = TxnCall(
        "init_producer", txn_id, init_pid, init_epoch, init_at - 1.0, None, (), init_error, answered
    )
    calls = [start, *(offsets if offsets is not None else (progress_sent(shard),)), ended, init]
    if late_end:
        calls.append(TxnCall("end_txn", txn_id, 5, 2, init_at + 1.0, True, (), None, None))
    return journal, wire_of(*calls)


def sink_read(wire: TxnWireLog, asked: float, offset: int = 4, client: str = "rdkafka") -> None:
    """The group coordinator answers a progress read of shard 0 asked at `asked`."""
    wire._offsets.append(
        OffsetAnswer(
            "millstream.progress.app.relay.0.out", "__millstream_progress", 0, offset,
            asked + 0.01, asked, client,
        )
    )  # fmt: skip


def test_stale_progress_after_the_shards_re_init_answered_is_the_brokers(tmp_path: Path) -> None:
    journal, wire = unanswered_commit_then_reinit(tmp_path)
    sink_read(wire, 21.0)
    why: list[str] = []
    evidence = reinit_unapplied_progress_evidence(
        ["e1"], TOPIC, journal, delivered_twice_log(), wire, why=why
    )
    assert evidence is not None and "InitProducerId answered epoch 3 at 20.000" in evidence, why
    # The acked rule does not hold here (no EndTxn answer), and says why.
    assert acked_commit_unapplied_progress_evidence(
        ["e1"], TOPIC, journal, delivered_twice_log(), wire, {0: [(21.0, 4)]}, why=why
    ) is None  # fmt: skip
    assert any("no EndTxn(commit) answered" in w for w in why), why


def test_delivered_again_after_a_re_init_is_ours_without_each_broker_fact(
    tmp_path: Path,
) -> None:
    journal, wire = unanswered_commit_then_reinit(tmp_path)

    def judge(
        w: TxnWireLog,
        log: list[list[RawBatch]] | None = None,
        asked: float | None = 21.0,
        offset: int = 4,
        client: str = "rdkafka",
        journal: Path = journal,
    ) -> str | None:
        w = wire_of(*w.calls())
        if asked is not None:
            sink_read(w, asked, offset, client)
        return reinit_unapplied_progress_evidence(
            ["e1"], TOPIC, journal, log or delivered_twice_log(), w
        )

    def variant(**kwargs: Any) -> TxnWireLog:
        return unanswered_commit_then_reinit(tmp_path, **kwargs)[1]

    assert judge(wire) is not None
    assert judge(wire, delivered_twice_log(ABORT)) is None  # the broker aborted it
    # The sink asked to abort, not commit: a COMMIT marker is then not explained this way.
    assert judge(variant(commit=False)) is None
    # The transaction did not carry the progress (none sent, seq 4's own offset, refused):
    # records committed with the old progress is then what Kafka does too.
    refused = replace(progress_sent(), error_code=48)
    for offsets in ((), (progress_sent(offset=4),), (refused,), (progress_sent(shard=1),)):
        assert judge(variant(offsets=offsets)) is None, offsets
    # No re-init answered (refused, unanswered, another shard's or producer id's, an epoch
    # outside the two copies', answered before the commit was asked for).
    for bad in (
        variant(init_error=51),
        variant(init_error=None),
        variant(shard=1, offsets=(progress_sent(),)),
        variant(init_pid=6),
        variant(init_epoch=2),
        variant(init_epoch=4),
        variant(init_at=9.4),
        wire_of(),
    ):
        assert judge(bad) is None
    # The old epoch's commit sent after the re-init: a fencing question, not this rule's.
    assert judge(variant(late_end=True)) is None
    # The sink read "delivered", or read "not delivered" only before the re-init or after the
    # second delivery, or only the watcher did: the sink delivered again on its own.
    assert judge(wire, offset=5) is None
    assert judge(wire, asked=19.5) is None
    assert judge(wire, asked=31.0) is None
    assert judge(wire, asked=None) is None
    assert judge(wire, client=WATCHER_CLIENT) is None
    # Two deliveries in the journal: not one checkpoint delivered again after a lost answer.
    assert judge(wire, journal=twice_journal(tmp_path)) is None
    broken = wire_of(*wire.calls())
    broken.errors.append("unparsed")
    assert judge(broken) is None


# ---------------------------------------------------------------- plain consumer


def fenced_then_live() -> list[list[RawBatch]]:
    """p0: producer 7 epoch 0 wrote e1 and was fenced (ABORT); epoch 1 re-delivered e1,
    committed, then aborted e2 itself and committed it again."""
    return [
        [
            data(0, 7, event="e1", epoch=0),
            marker(1, 7, ABORT, epoch=0),
            data(2, 7, event="e1", epoch=1),
            marker(3, 7, COMMIT, epoch=1),
            data(4, 7, event="e2", epoch=1),
            marker(5, 7, ABORT, epoch=1),
            data(6, 7, event="e2", epoch=1),
            marker(7, 7, COMMIT, epoch=1),
        ]
    ]


def test_plain_view_exact_and_leak_of_a_fenced_producer() -> None:
    log = fenced_then_live()
    assert judge_plain_view("t", [(0, 2), (0, 6)], log).exact
    view = judge_plain_view("t", [(0, 0), (0, 2), (0, 6)], log)
    assert view.only_leaks and [(o.offset, o.producer_epoch) for o in view.leaked] == [(0, 0)]


def test_extra_record_under_abort_of_the_live_producer_is_not_a_broker_defect() -> None:
    view = judge_plain_view("t", [(0, 2), (0, 4), (0, 6)], fenced_then_live())
    assert not view.only_leaks and "live producer id 7 epoch 1" in view.unexplained[0]


def test_extra_record_under_commit_is_not_a_broker_defect() -> None:
    # e3 is committed but sits after producer 9's transaction, which has no marker: Apache
    # Kafka's read_committed stops there, so serving it is no aborted-data leak.
    log = [[data(0, 9, event="e1"), data(1, 7, event="e3"), marker(2, 7, COMMIT)]]
    view = judge_plain_view("t", [(0, 1)], log)
    assert not view.only_leaks and "'COMMIT', not ABORT" in view.unexplained[0]


def test_missing_and_doubled_records_never_pass_as_a_broker_defect() -> None:
    log = fenced_then_live()
    withheld = judge_plain_view("t", [(0, 0), (0, 2)], log)  # a leak, and e2 withheld
    assert not withheld.only_leaks and withheld.withheld == [(0, 6)]
    twice = judge_plain_view("t", [(0, 0), (0, 2), (0, 2), (0, 6)], log)
    assert not twice.only_leaks and "served 2 times" in twice.unexplained[0]
    nowhere = judge_plain_view("t", [(0, 2), (0, 6), (0, 99)], log)
    assert not nowhere.only_leaks and "no data record" in nowhere.unexplained[0]


def test_withheld_records_are_the_brokers_only_when_its_log_contradicts_its_lso() -> None:
    # Producer 2 epoch 0 aborted (fenced); epoch 1 then committed e2 at offset 3.
    log = [
        [
            data(0, 2, event="e1"),
            marker(1, 2, ABORT),
            marker(2, 3, ABORT),
            data(3, 2, event="e2", epoch=1),
            marker(4, 2, COMMIT, epoch=1),
        ]
    ]
    view = judge_plain_view("t", [], log)
    assert view.withheld == [(0, 3)] and not view.unexplained
    evidence = withheld_by_broker(view, log, {0: 0})
    assert (
        evidence is not None
        and "last stable offset 0 (ListOffsets), no open transaction" in evidence
    )
    # An LSO past the withheld record: the consumer, not the broker's answer, stopped.
    assert withheld_by_broker(view, log, {0: 5}) is None
    # An LSO the broker would not give is no evidence.
    assert withheld_by_broker(view, log, {0: "unreadable (TimeoutError)"}) is None
    # Nor is the protocol's "unknown" (-1), which a Fetch response may carry.
    assert withheld_by_broker(view, log, {0: -1}) is None
    # The same rule on the last stable offset of a Fetch response, named as its source.
    fetched = withheld_by_broker(view, log, {0: 3}, answered_by="a read_committed Fetch")
    assert fetched is not None and "last stable offset 3 (a read_committed Fetch)" in fetched


def test_withheld_records_behind_an_open_transaction_are_not_the_brokers() -> None:
    # Producer 9's transaction has no marker: a right broker also stops read_committed there.
    # (judge_plain_view does not count e1 as withheld at all; the guard holds on its own.)
    log = [[data(0, 9, event="e9"), data(1, 7, event="e1"), marker(2, 7, COMMIT)]]
    assert judge_plain_view("t", [], log).withheld == []
    view = PlainView(leaked=[], unexplained=[], withheld=[(0, 1)])
    assert withheld_by_broker(view, log, {0: 0}) is None


def test_committed_records_the_broker_lists_as_aborted_are_the_brokers() -> None:
    """The CI case: a read_committed consumer skipped e19 at offset 0 (pid 2) below the last
    stable offset while serving later records; the broker's Fetch listed pid 2's transaction
    as aborted although its log marks it COMMIT."""
    log = [[data(0, 2, event="e19"), data(1, 3, event="e1"), marker(2, 3), marker(3, 2)]]
    view = judge_plain_view("t", [(0, 1)], log)
    assert view.withheld == [(0, 0)] and not view.unexplained
    evidence = listed_aborted_but_committed(view, log, {0: [(2, 0)]})
    assert evidence is not None and "lists aborted transactions [(2, 0)]" in evidence
    # Not listed, listed for another producer, or listed as starting after the record: no.
    assert listed_aborted_but_committed(view, log, {0: []}) is None
    assert listed_aborted_but_committed(view, log, {0: [(3, 0)]}) is None
    assert listed_aborted_but_committed(view, log, {0: [(2, 1)]}) is None
    # The producer's next marker is ABORT: a right broker lists it too; not the broker's.
    aborted = [[data(0, 2, event="e19"), marker(1, 2, ABORT)]]
    held = PlainView(leaked=[], unexplained=[], withheld=[(0, 0)])
    assert listed_aborted_but_committed(held, aborted, {0: [(2, 0)]}) is None
    # No marker at all (an open transaction): not the broker's either.
    assert listed_aborted_but_committed(held, [[data(0, 2, event="e19")]], {0: [(2, 0)]}) is None


# ---------------------------------------------------------------- unserved / stuck


def input_log(events: dict[int, str]) -> list[list[RawBatch]]:
    return [[data(o, -1, transactional=False, event=e) for o, e in sorted(events.items())]]


def test_input_acknowledged_but_not_served_is_the_brokers() -> None:
    inputs = input_log({0: "e1", 2: "e3"})  # offset 1, where e2 was acknowledged, is gone
    found = unserved_ack_evidence(["e2"], [], [[]], inputs, {"e2": [(0, 1)]})
    assert found is not None and found[0] == UNSERVED_ACK_REASON, found


def test_an_input_that_is_served_or_never_acknowledged_is_ours() -> None:
    inputs = input_log({0: "e1", 1: "e2"})
    assert unserved_ack_evidence(["e2"], [], [[]], inputs, {"e2": [(0, 1)]}) is None
    assert unserved_ack_evidence(["e2"], [], [[]], input_log({}), {}) is None
    assert unserved_ack_evidence(["e2"], [object()], [[]], input_log({}), {"e2": [(0, 1)]}) is None


def stuck_log() -> list[list[RawBatch]]:
    """p0: producer 9 opened a transaction at 0 and never marked it; e2 committed behind it."""
    return [[data(0, 9, event="e1"), data(1, 7, event="e2"), marker(2, 7, COMMIT)]]


def test_committed_record_behind_a_transaction_open_for_a_whole_timeout() -> None:
    log = stuck_log()
    found = unserved_ack_evidence(["e2"], [], log, None, {}, earlier=log, waited_s=WAITED)
    assert found is not None and found[0] == STUCK_TXN_REASON, found


def test_a_stuck_transaction_needs_a_whole_timeout_and_a_committed_record() -> None:
    log = stuck_log()
    assert unserved_ack_evidence(["e2"], [], log, None, {}) is None  # not watched
    assert unserved_ack_evidence(["e2"], [], log, None, {}, earlier=log, waited_s=10) is None
    # Open in the earlier read, since marked; the current one's blocker is another.
    later = [[*log[0], marker(3, 9, ABORT), data(4, 8, event="e4"), data(5, 7, event="e5")]]
    later[0].append(marker(6, 7, COMMIT))
    assert unserved_ack_evidence(["e5"], [], later, None, {}, earlier=log, waited_s=WAITED) is None
    # The missing record itself aborted: the sink's to deliver again, not the broker's.
    aborted = [[data(0, 9, event="e1"), data(1, 7, event="e2"), marker(2, 7, ABORT)]]
    assert (
        unserved_ack_evidence(["e2"], [], aborted, None, {}, earlier=aborted, waited_s=WAITED)
        is None
    )


# ---------------------------------------------------------------- helpers


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
