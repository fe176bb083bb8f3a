"""The executor side of docs/design.md section 4: one shard of one computation's part of a batch.

`acquire` -> `dedup` (`connectors/fresh_records.py`) -> `load` -> operator `after_load` -> `fire_timers` -> `run_records`
(operator `process_key`, a key's batch at a time) -> `fire_timers_at_end` -> operator
`before_commit` -> `commit` (one guarded commit). The operator (`connectors/operator.py`: a
hand-written `Computation`, a window, ...) is called at those points and writes through a
`KeyRunner`; the protocol around it is the same for all. The task returns its checkpointed
productions with its lease, and the driver hands them over, delivers and acknowledges them
(`connectors/settlement.py`). Weak productions are delivered before the commit (`deliver_weak`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from millstream.connectors.delivery import deliver_all
from millstream.connectors.fresh_records import Fresh, KeyRecords, decode_inputs, dedup, to_record
from millstream.connectors.key_runner import ERROR as ERROR
from millstream.connectors.key_runner import KEY as KEY
from millstream.connectors.key_runner import (
    OFFSET,
    PARTITION,
    SOURCE,
    STREAM,
    TS,
    KeyRunner,
    rejected,
)
from millstream.connectors.operator import Operator
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.topology import ComputationSpec
from millstream.errors import ConfigurationError, FencedError, MillstreamError, StaleBatchError
from millstream.fault_points import fault_point
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.replay import SOURCE as REPLAY_SOURCE
from millstream.state.shard import ShardStore
from millstream.state.timers import firing_order

log = logging.getLogger(__name__)
FENCED_RETRIES = 3


@dataclass
class ShardResult:
    shard: int
    counters: dict[str, int] = field(default_factory=dict)
    consumed: dict[str, dict[int, int]] = field(default_factory=dict)  # stream -> partition -> next
    round_trips: int = 0
    fenced_retries: int = 0
    seconds: float = 0.0
    # Delivered by the driver (connectors/settlement.py): the checkpointed productions
    # still to deliver, how many of them an earlier owner left, and the lease this task
    # committed under (token, version, next seq), which guards the driver's acknowledgement.
    outstanding: list[Production] = field(default_factory=list)
    redelivered: int = 0
    lease: tuple[int, int, int] | None = None


def run_shard(
    plan: BatchPlan, spec: ComputationSpec, shard: int, items: list[TaskInput]
) -> ShardResult:
    """Entry point of a shard task; a fenced attempt re-runs from acquire (its writes were void)."""
    started = time.perf_counter()
    items.sort(key=lambda i: (i.row[STREAM], i.row[SOURCE], i.row[PARTITION], i.row[OFFSET]))
    items = decode_inputs(items, spec.formats)
    client = connect(plan.redis_url)
    keys = ShardKeys(plan.app, spec.name, shard, plan.generation)
    retries = 0
    while True:
        store = ShardStore(client, keys, plan.shard_config)
        try:
            result = _run_once(plan, spec, store, items)
            break
        except FencedError as exc:
            last = store.last_committed_batch()
            if last is not None and last > plan.batch_id:
                # A zombie of a batch that is over: acquiring again would fence the task of
                # the current batch. Its writes were void; stop, and say so.
                raise StaleBatchError(
                    f"shard {keys.tag}: task of batch {plan.batch_id} fenced; the shard has "
                    f"committed batch {last} since, so this task stops ({exc})"
                ) from None
            retries += 1
            if retries >= FENCED_RETRIES:
                raise
            log.warning(
                "shard %s fenced by a newer owner; re-running (attempt %d)", keys.tag, retries
            )
    result.shard = shard
    result.fenced_retries = retries
    result.round_trips = store.round_trips
    result.seconds = time.perf_counter() - started
    return result


def _run_once(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, items: list[TaskInput]
) -> ShardResult:
    """docs/design.md section 4 for one shard, one step a function, the operator called at each."""
    result = ShardResult(shard=store.keys.shard)
    operator = spec.operator
    pending = acquire(store)
    _note_positions(result, items, plan.internal_inputs)
    fresh = dedup(plan, spec, store, items)
    keys_needed = list(dict.fromkeys(f[0].key or "" for f in fresh if f[0].error is None))
    start = plan.input_watermark.event
    end = start if plan.end_watermark is None else max(start, plan.end_watermark.event)
    states, due = store.load(keys_needed, end, plan.now)
    txn = store.begin(plan.batch_id)
    runner = KeyRunner(plan, spec, dict(states), txn)
    operator.after_load(runner, keys_needed)
    fire_timers(operator, runner, txn, [t for t in due if not _after_records(t, start)])
    run_records(operator, runner, fresh)
    fire_timers_at_end(operator, runner, txn, [t for t in due if _after_records(t, start)])
    operator.before_commit(runner)
    deliver_weak(plan, spec, store, runner)
    commit(store, txn, runner, fresh, plan.gc_watermark)
    fault_point(f"after_commit_{spec.name}")  # committed, nothing returned to the driver yet
    outstanding = {p.id: p for p in [*pending, *txn.productions]}
    if outstanding:
        # The driver hands these over, delivers and acknowledges them under this lease.
        result.outstanding = sorted(outstanding.values(), key=lambda p: p.seq)
        result.redelivered = len(pending)
        result.lease = store.position()
    result.counters = runner.counters
    return result


def acquire(store: ShardStore) -> list[Production]:
    """1. Take the shard's lease (fencing any older owner); its pending checkpoints."""
    store.acquire()
    return store.pending_productions()


def _note_positions(result: ShardResult, items: list[TaskInput], internal: frozenset[str]) -> None:
    """The next offset per input partition read past (consumed offsets of topic inputs: only
    internal streams can be read from a topic another query writes)."""
    for item in items:
        row = item.row
        if row[STREAM] not in internal or row[SOURCE] == REPLAY_SOURCE:
            continue
        by_partition = result.consumed.setdefault(row[STREAM], {})
        by_partition[row[PARTITION]] = max(by_partition.get(row[PARTITION], 0), row[OFFSET] + 1)


def _after_records(timer: Timer, input_watermark: int) -> bool:
    """An event timer due only at the batch's end watermark fires after the records."""
    return timer.domain is TimeDomain.EVENT and timer.time > input_watermark


def _still_set(txn: Any, timer: Timer) -> bool:
    """Not moved or deleted by an earlier firing (or record) of this batch."""
    if not txn.has_timer_op(timer.key, timer.tag):
        return True
    return txn.timer_op(timer.key, timer.tag) == (timer.domain, timer.time, timer.hold)


def fire_timers(operator: Operator, runner: KeyRunner, txn: Any, due: list[Timer]) -> None:
    """3. Due timers, before the records: each has time <= W (the batch's input watermark)
    while every on-time record of the batch has timestamp >= W, so in event time they come
    first. A timer an earlier firing of this batch moved or deleted does not fire."""
    if operator.timers_per_key:
        by_key: dict[str, list[Timer]] = {}
        for timer in firing_order(due):
            if _still_set(txn, timer):
                by_key.setdefault(timer.key, []).append(timer)
        for key, timers in by_key.items():
            for timer in timers:
                txn.delete_timer(key, timer.tag)
            operator.process_timers(runner, key, timers)
        return
    for timer in firing_order(due):
        if not _still_set(txn, timer):
            continue
        txn.delete_timer(timer.key, timer.tag)
        operator.process_timer(runner, timer)


def fire_timers_at_end(
    operator: Operator, runner: KeyRunner, txn: Any, stored: list[Timer]
) -> None:
    """4b. Event timers due at the batch's end watermark (`BatchPlan.end_watermark`), after
    the records: stored ones and those the records just set. Once the batch's records are
    applied, no input older than that watermark is still to come, so a window whose end it
    passed closes in this batch rather than one trigger later."""
    if runner.plan.end_watermark is None:
        return
    end = runner.plan.end_watermark.event
    due = {(t.key, t.tag): t for t in stored}
    for key, tag, domain, time_, hold in txn.set_timers():
        if domain is TimeDomain.EVENT and time_ <= end:
            due[(key, tag)] = Timer(key, tag, time_, domain, hold)
    if due:
        runner.low_watermark = end
        fire_timers(operator, runner, txn, list(due.values()))


def run_records(operator: Operator, runner: KeyRunner, fresh: list[Fresh]) -> None:
    """4. The fresh records: bad input becomes dead letters, records the operator finds
    expired are counted late (then dropped, flagged or dead-lettered: the `late` option), and
    the rest go to the operator a key at a time, in arrival order per key (`KeyRecords`: a
    record is built only where something reads it)."""
    plan = runner.plan
    wm = plan.input_watermark.event
    internal = plan.internal_inputs
    by_key: dict[str, list[TaskInput]] = {}
    built: dict[str, dict[int, Record]] = {}  # records made already: behind the watermark
    for entry in fresh:
        item = entry[0]
        row = item.row
        key = item.key or ""
        error = item.error if item.error is not None else rejected(plan, row)
        if error is not None:
            runner.dead_letter(key, error, row)
            continue
        timestamp = row[TS]
        if timestamp is not None and timestamp < wm:
            record = to_record(item, internal)
            if operator.expired(record, wm):
                flagged = runner.late(record, row, wm)
                if flagged is None:
                    continue
                record = flagged
            built.setdefault(key, {})[len(by_key.get(key, ()))] = record
        by_key.setdefault(key, []).append(item)
    for key, items in by_key.items():
        operator.process_key(runner, key, KeyRecords(items, internal, built.get(key)))


def deliver_weak(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, runner: KeyRunner
) -> None:
    """Weak productions: delivered now, before the commit; only stragglers are checkpointed."""
    if not runner.weak:
        return
    try:
        deliver_all(plan, spec.name, store.keys.shard, runner.weak)
        runner.count("weak_delivered", len(runner.weak))
        fault_point("after_weak_delivery")  # delivered downstream, nothing committed here
    except ConfigurationError:
        raise
    except (MillstreamError, KafkaException) as exc:
        log.warning("shard %s: weak delivery failed, checkpointing: %s", store.keys.tag, exc)
        for production in runner.weak:
            runner.txn.checkpoint(production)
        runner.count("weak_stragglers", len(runner.weak))


def commit(
    store: ShardStore,
    txn: Any,
    runner: KeyRunner,
    fresh: list[Fresh],
    gc_watermark: int,
) -> None:
    """5. One guarded commit: state, timers, record ids, checkpoints and counters, or nothing
    (FencedError when a newer owner holds the lease)."""
    bucket_of = store.bucket_of
    txn.add_digests([(bucket_of(t), d, where) for _, _, t, where, d in fresh if d])
    marks, expired = store.offset_marks.writes(gc_watermark)
    if marks or expired:
        txn.move_offset_marks(marks, expired)
    drop = store.gc_buckets(gc_watermark)
    if drop:
        txn.drop_buckets(drop)
    stats = store.dedup_stats
    runner.count("duplicates", stats.duplicates)
    runner.count("replays", stats.replays)
    runner.count("remnants", stats.remnants)
    runner.count("catalog_reads", stats.catalog_reads)
    runner.count("lookups_avoided", stats.lookups_avoided)
    runner.count("false_positives", stats.false_positives)
    runner.count("offset_marked", stats.by_offset)
    runner.count("productions", len(txn.productions))
    for name, amount in runner.counters.items():
        txn.count(name, amount)
    if not txn.is_empty():
        store.commit(txn)
