"""The executor side of docs/design.md section 4: one shard of one computation's part of a batch.

`acquire` -> `dedup` -> `load` -> operator `after_load` -> `fire_timers` -> `run_records`
(operator `process_key`, a key's batch at a time) -> `fire_timers_at_end` -> operator
`before_commit` -> `commit` (one guarded commit). The operator (`connectors/operator.py`: a
hand-written `Computation`, a window, ...) is called at those points and writes through a
`KeyRunner`; the protocol around it is the same for all. The task returns its checkpointed
productions with its lease, and the driver hands them over, delivers and acknowledges them
(`connectors/settlement.py`). Weak productions are delivered before the commit (`deliver_weak`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from millstream.connectors.delivery import deliver_all
from millstream.connectors.formats import FormatError, ValueFormat, decode_with
from millstream.connectors.key_runner import ERROR as ERROR
from millstream.connectors.key_runner import (
    HEADERS,
    ID,
    OFFSET,
    PARTITION,
    SOURCE,
    STREAM,
    SYSTEM,
    TS,
    VALUE,
    KeyRunner,
    rejected,
)
from millstream.connectors.key_runner import KEY as KEY
from millstream.connectors.operator import Operator
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.topology import ComputationSpec
from millstream.errors import ConfigurationError, FencedError, MillstreamError, StaleBatchError
from millstream.fault_points import fault_point
from millstream.headers import HEADER_ID, HEADER_SYSTEM_TIME, decode_time_header, visible_headers
from millstream.injectors.record_ids import is_position, partition_prefix
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.state.catalog import Verdict
from millstream.state.catalog_entries import digest as id_digest
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.offset_marks import Run
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


def header(headers: Iterable[Any] | None, name: str) -> bytes | None:
    for item in headers or ():
        if item[0] == name:
            return item[1]
    return None


def to_record(item: TaskInput, internal: frozenset[str]) -> Record:
    """Internal streams carry the production's id and system time in headers; user code sees
    the other headers only (`visible_headers`)."""
    row = item.row
    rid, system_time = row[ID], row[SYSTEM]
    if row[STREAM] in internal:
        rid = header(row[HEADERS], HEADER_ID) or rid
        system_time = decode_time_header(header(row[HEADERS], HEADER_SYSTEM_TIME)) or system_time
    # Positional, in Record's field order: a third cheaper than keywords, once per record.
    headers = visible_headers(row[HEADERS])
    return Record(
        item.key or "", row[VALUE] or b"", row[TS], rid, system_time, row[STREAM], False,
        headers, item.data,
    )  # fmt: skip


def format_error(row: tuple, exc: FormatError) -> str:
    """A dead letter's reason for a value its stream's format cannot read: stream, position
    (topic or producer, partition or shard, offset or seq), format and cause."""
    return (
        f"value of stream {row[STREAM]!r} at {row[SOURCE]} partition {row[PARTITION]} "
        f"offset {row[OFFSET]} {exc}"
    )


def decode_inputs(items: list[TaskInput], formats: Mapping[str, ValueFormat]) -> list[TaskInput]:
    """Decode the values routing left undecoded (a router not given the formats); a value
    that does not decode becomes an error item, dead-lettered like any bad input."""
    if not formats:
        return items
    out: list[TaskInput] = []
    for item in items:
        fmt = formats.get(item.row[STREAM])
        if fmt is None or item.decoded or item.error is not None:
            out.append(item)
            continue
        try:
            data = decode_with(fmt, item.row[VALUE] or b"")
        except FormatError as exc:
            out.append(dataclasses.replace(item, error=format_error(item.row, exc)))
        else:
            out.append(dataclasses.replace(item, data=data, decoded=True))
    return out


def _position(row: tuple) -> bytes:
    """Where a delivery came from: tells a replayed batch from a duplicate the source sent."""
    return f"{row[SOURCE]}:{row[PARTITION]}:{row[OFFSET]}".encode()


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
    keys_needed = list(dict.fromkeys(r.key for i, r, _, _ in fresh if i.error is None))
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


# A fresh record: its routed input, the record, the position it was delivered from and its
# id's digest (what the catalog remembers of it, hashed once for the verdict and the write).
# A record whose id is its Kafka position has neither (b""): the offset marks remember it.
Fresh = tuple[TaskInput, Record, bytes, bytes]


def dedup(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, items: list[TaskInput]
) -> list[Fresh]:
    """2. The records not applied before: those whose id is their Kafka position by the
    shard's offset marks, the others (and those of a partition without a mark) by the Bloom
    filter, then the catalog."""
    records = [to_record(i, plan.internal_inputs) for i in items]
    verdicts: list[Verdict | None] = [None] * len(records)
    exactly_once = spec.options.exactly_once
    runs = offset_runs(items, records)
    if runs:
        found = store.dedup_by_offset([run for _, run in runs], plan.gc_watermark)
        indexes = [i for run_indexes, _ in runs for i in run_indexes]
        for index, verdict in zip(indexes, found, strict=True):
            if verdict is not None:
                verdicts[index] = verdict if exactly_once else Verdict.NEW
    rest = [i for i, v in enumerate(verdicts) if v is None]
    positions = [b""] * len(records)
    digests = [b""] * len(records)
    for index in rest:
        positions[index] = _position(items[index].row)
        digests[index] = id_digest(records[index].id)
    if exactly_once and rest:
        looked_up = store.dedup(
            [(records[i].id, records[i].system_time, positions[i]) for i in rest],
            plan.gc_watermark,
            [digests[i] for i in rest],
        )
        for index, verdict in zip(rest, looked_up, strict=True):
            verdicts[index] = verdict
    new = Verdict.NEW
    return [
        (i, r, p, d)
        for i, r, p, d, v in zip(items, records, positions, digests, verdicts, strict=True)
        if v is None or v is new
    ]


def offset_runs(items: list[TaskInput], records: list[Record]) -> list[tuple[list[int], Run]]:
    """The records whose ids are their Kafka position (`record_ids.is_position`), one run per
    stream and partition in offset order, with their indexes in `items`."""
    by_partition: dict[tuple[Any, Any, Any], tuple[bytes | None, list[int], Run]] = {}
    for index, (item, record) in enumerate(zip(items, records, strict=True)):
        row = item.row
        where = (row[STREAM], row[SOURCE], row[PARTITION])
        entry = by_partition.get(where)
        if entry is None:
            prefix = partition_prefix(row[SOURCE], row[PARTITION])
            entry = by_partition[where] = (prefix, [], (prefix or b"", [], [], []))
        prefix = entry[0]
        if prefix is None or not is_position(record.id, prefix, row[OFFSET]):
            continue
        entry[1].append(index)
        _, offsets, keys, times = entry[2]
        offsets.append(row[OFFSET])
        keys.append(record.key)
        times.append(record.system_time)
    runs = []
    for _, indexes, run in by_partition.values():
        if not indexes:
            continue
        offsets = run[1]
        if any(a > b for a, b in itertools.pairwise(offsets)):  # not sorted by the caller
            order = sorted(range(len(offsets)), key=offsets.__getitem__)
            indexes = [indexes[o] for o in order]
            run = (run[0], *([column[o] for o in order] for column in run[1:]))  # type: ignore[assignment]
        runs.append((indexes, run))
    return runs


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
    the rest go to the operator a key at a time, in arrival order per key."""
    plan = runner.plan
    wm = plan.input_watermark.event
    by_key: dict[str, list[tuple[Record, tuple]]] = {}
    for item, record, _, _ in fresh:
        error = item.error if item.error is not None else rejected(plan, item.row)
        if error is not None:
            runner.dead_letter(record.key, error, item.row)
            continue
        if record.timestamp is not None and record.timestamp < wm and operator.expired(record, wm):
            flagged = runner.late(record, item.row, wm)
            if flagged is None:
                continue
            record = flagged
        by_key.setdefault(record.key, []).append((record, item.row))
    for key, batch in by_key.items():
        operator.process_key(runner, key, batch)


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
    txn.add_digests([(bucket_of(r.system_time), d, where) for _, r, where, d in fresh if d])
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
