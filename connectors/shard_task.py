"""The executor side of DESIGN.md section 2: one shard of one computation's part of a batch.

`acquire` -> `dedup` -> `fire_timers` -> `run_records` -> `fire_timers_at_end` -> `commit`
(one guarded commit); the task returns its checkpointed productions with its lease, and the
driver hands them over, delivers and acknowledges them (`connectors/fused.py`). Weak
productions are delivered before the commit (`deliver_weak`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from millstream.connectors.computation import Context
from millstream.connectors.delivery import deliver_all
from millstream.connectors.formats import FormatError, ValueFormat, decode_with
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.serde import serde_named
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec
from millstream.errors import ConfigurationError, FencedError, MillstreamError, StaleBatchError
from millstream.fault_points import fault_point
from millstream.headers import (
    HEADER_ID,
    HEADER_SYSTEM_TIME,
    decode_time_header,
    visible_headers,
)
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.state.catalog import Verdict
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardStore
from millstream.state.timers import firing_order

log = logging.getLogger(__name__)
FENCED_RETRIES = 3
# A dead letter carries at most this much of the record's value (its size is given): an
# oversized record must not make an undeliverable dead letter.
DEAD_LETTER_VALUE_BYTES = 16 * 1024

# Column positions of injectors.schema.INJECTED_SCHEMA.
STREAM, ID, KEY, VALUE, TS, SYSTEM, SOURCE, PARTITION, OFFSET, HEADERS, ERROR = range(11)


@dataclass
class ShardResult:
    shard: int
    counters: dict[str, int] = field(default_factory=dict)
    consumed: dict[str, dict[int, int]] = field(default_factory=dict)  # stream -> partition -> next
    round_trips: int = 0
    fenced_retries: int = 0
    seconds: float = 0.0
    # Delivery by the driver (BatchPlan.deliver_in_task False): the checkpointed productions
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
    return Record(
        key=item.key or "",
        value=row[VALUE] or b"",
        timestamp=row[TS],
        id=rid,
        system_time=system_time,
        stream=row[STREAM],
        headers=visible_headers(row[HEADERS]),
        data=item.data,
    )


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


def _rejected(plan: BatchPlan, row: tuple) -> str | None:
    """Why an otherwise good record must be dead-lettered instead of processed, or None.

    Oversized records would make per-key state, catalogs and productions in Redis unbounded;
    an event time far ahead of the clock would open windows and timers that never close.
    """
    size = len(row[KEY] or b"") + len(row[VALUE] or b"")
    if size > plan.max_record_bytes:
        return (
            f"record of {size} bytes (key plus value) exceeds MILLSTREAM_MAX_RECORD_BYTES="
            f"{plan.max_record_bytes}; raise it to accept such records"
        )
    ts = row[TS]
    if ts is not None and ts > plan.now + plan.max_future_ms:
        return (
            f"event time {ts} is {ts - plan.now} ms ahead of the clock, more than "
            f"MILLSTREAM_MAX_FUTURE_MS={plan.max_future_ms}"
        )
    return None


def dead_letter(
    plan: BatchPlan, spec: ComputationSpec, key: str, reason: str, row: tuple | None, **extra: Any
) -> Production:
    """A dead-letter production: the reason, the computation, the key and the record's position."""
    body: dict[str, Any] = {"computation": spec.name, "key": key, "error": reason, **extra}
    timestamp = plan.now
    if row is not None:
        value = row[VALUE] or b""
        body.update(
            stream=row[STREAM],
            source=row[SOURCE],
            partition=row[PARTITION],
            offset=row[OFFSET],
            record_id=(row[ID] or b"").hex(),
            value=value[:DEAD_LETTER_VALUE_BYTES].decode("utf-8", "backslashreplace"),
            timestamp=row[TS],
        )
        if len(value) > DEAD_LETTER_VALUE_BYTES:
            body.update(value_bytes=len(value), value_truncated=True)
        if row[TS] is not None and 0 <= row[TS] <= plan.now + plan.max_future_ms:
            timestamp = row[TS]
    return Production(
        stream=DEAD_LETTERS,
        key=key,
        value=json.dumps(body, sort_keys=True).encode(),
        timestamp=timestamp,
        id=uuid.uuid4().bytes,
        system_time=plan.now,
    )


class _KeyRunner:
    """Runs user code for one shard, key by key, applying successful calls to the transaction."""

    def __init__(self, plan: BatchPlan, spec: ComputationSpec, states: dict[str, bytes | None]):
        self.plan = plan
        self.spec = spec
        self.states = states
        self.serde = serde_named(spec.options.serde)
        self.counters: dict[str, int] = {}
        weak = spec.options.productions == "weak"
        self.weak: list[Production] | None = [] if weak else None
        # What user code sees as the low watermark: the batch's input watermark, then its end
        # watermark for the timers that fire after the records.
        self.low_watermark = plan.input_watermark.event

    def _id_factory(self, origin: Record | Timer) -> Any:
        """Strong productions get random ids, fixed when checkpointed. Weak productions are sent
        before the commit, so a re-run must re-emit the same ids for consumers to drop: they
        derive from what triggered them (record id, or timer) and their index in the call."""
        if self.weak is None:
            return _random_id
        if isinstance(origin, Record):
            seed = b"r" + origin.id
        else:
            seed = f"t{origin.key}\x1f{origin.tag}\x1f{origin.time}".encode()
        base = hashlib.blake2b(self.spec.name.encode() + b"\x00" + seed, digest_size=12).digest()
        counter = iter(range(1 << 30))
        return lambda: base + next(counter).to_bytes(4, "big")

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def call(self, key: str, fn: Any, arg: Record | Timer) -> Context | Exception:
        """Call user code with retries; returns the successful context or the last error."""
        error: Exception | None = None
        if isinstance(arg, Record):
            timestamp, cause = arg.timestamp, "the record"
        else:
            timestamp = arg.output_time
            held = "" if arg.hold is None else f", held at {arg.hold}"
            cause = f"timer {arg.tag!r} at {arg.time}{held}"
        for _ in range(self.plan.user_retries + 1):
            ctx = Context(
                key,
                new_id=self._id_factory(arg),
                state=self.states.get(key),
                serde=self.serde,
                low_watermark=self.low_watermark,
                now=self.plan.now,
                timestamp=timestamp,
                outputs=self.spec.outputs,
                cause=cause,
                allowed_skew_ms=self.spec.options.allowed_timestamp_skew_ms,
                output_watermark=self.plan.output_watermark,
                formats=self.spec.formats,
            )
            try:
                fn(ctx, arg)
                ctx.state_effect()  # a state the serde cannot encode is a user error too
                return ctx
            except Exception as exc:
                error = exc
        assert error is not None
        if self.plan.fail_stop:
            raise MillstreamError(
                f"computation {self.spec.name!r} failed on key {key!r} after "
                f"{self.plan.user_retries} retries (MILLSTREAM_ON_USER_ERROR=fail-stop): {error!r}"
            ) from error
        return error


def run_shard(
    plan: BatchPlan, spec: ComputationSpec, shard: int, items: list[TaskInput]
) -> ShardResult:
    """Entry point of a shard task; a fenced attempt re-runs from acquire (its writes were void)."""
    started = time.perf_counter()
    items.sort(key=lambda i: (i.row[STREAM], i.row[SOURCE], i.row[PARTITION], i.row[OFFSET]))
    items = decode_inputs(items, spec.formats)
    client = connect(plan.redis_url)
    keys = ShardKeys(plan.app, spec.name, shard)
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
    """DESIGN.md section 2 for one shard, one step a function."""
    result = ShardResult(shard=store.keys.shard)
    pending = acquire(store)
    _note_positions(result, items, plan.internal_inputs)
    fresh = dedup(plan, spec, store, items)
    keys_needed = [r.key for i, r, _ in fresh if i.error is None]
    start = plan.input_watermark.event
    end = start if plan.end_watermark is None else max(start, plan.end_watermark.event)
    states, due = store.load(keys_needed, end, plan.now)
    runner = _KeyRunner(plan, spec, dict(states))
    txn = store.begin(plan.batch_id)
    fire_timers(plan, spec, runner, txn, [t for t in due if not _after_records(t, start)])
    run_records(plan, spec, runner, txn, fresh)
    fire_timers_at_end(plan, spec, runner, txn, [t for t in due if _after_records(t, start)])
    deliver_weak(plan, spec, store, runner, txn)
    commit(store, txn, runner, fresh, plan.gc_watermark)
    fault_point(f"after_commit_{spec.name}")  # committed, nothing returned to the driver yet
    outstanding = {p.id: p for p in [*pending, *txn.productions]}
    if outstanding and not plan.deliver_in_task:
        # The driver hands these over, delivers and acknowledges them under this lease.
        result.outstanding = sorted(outstanding.values(), key=lambda p: p.seq)
        result.redelivered = len(pending)
        result.lease = store.position()
    elif outstanding:
        deliver_and_acknowledge(plan, spec, store, runner, list(outstanding.values()), pending)
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
        if row[STREAM] not in internal:
            continue
        by_partition = result.consumed.setdefault(row[STREAM], {})
        by_partition[row[PARTITION]] = max(by_partition.get(row[PARTITION], 0), row[OFFSET] + 1)


def dedup(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, items: list[TaskInput]
) -> list[tuple[TaskInput, Record, bytes]]:
    """2. The records not applied before (Bloom filter, then the catalog): the fresh ones, each
    with the position it was delivered from (what the catalog remembers of it)."""
    records = [to_record(i, plan.internal_inputs) for i in items]
    positions = [_position(i.row) for i in items]
    if spec.options.exactly_once and records:
        verdicts = store.dedup(
            [(r.id, r.system_time, p) for r, p in zip(records, positions, strict=True)],
            plan.gc_watermark,
        )
    else:
        verdicts = [Verdict.NEW] * len(records)
    return [
        (i, r, p)
        for i, r, p, v in zip(items, records, positions, verdicts, strict=True)
        if v is Verdict.NEW
    ]


def _after_records(timer: Timer, input_watermark: int) -> bool:
    """An event timer due only at the batch's end watermark fires after the records."""
    return timer.domain is TimeDomain.EVENT and timer.time > input_watermark


def _still_set(txn: Any, timer: Timer) -> bool:
    """Not moved or deleted by an earlier firing (or record) of this batch."""
    if not txn.has_timer_op(timer.key, timer.tag):
        return True
    return txn.timer_op(timer.key, timer.tag) == (timer.domain, timer.time, timer.hold)


def fire_timers(
    plan: BatchPlan, spec: ComputationSpec, runner: _KeyRunner, txn: Any, due: list[Timer]
) -> None:
    """3. Due timers, before the records: each has time <= W (the batch's input watermark)
    while every on-time record of the batch has timestamp >= W, so in event time they come
    first. A timer an earlier firing of this batch moved or deleted does not fire."""
    for timer in firing_order(due):
        if not _still_set(txn, timer):
            continue
        txn.delete_timer(timer.key, timer.tag)
        outcome = runner.call(timer.key, spec.computation.process_timer, timer)
        if isinstance(outcome, Exception):
            txn.checkpoint(
                dead_letter(
                    plan,
                    spec,
                    timer.key,
                    f"{type(outcome).__name__}: {outcome}",
                    None,
                    timer={
                        "tag": timer.tag,
                        "time": timer.time,
                        "domain": timer.domain.value,
                        "hold": timer.hold,
                    },
                )
            )
            runner.count("dead_letters")
            runner.count("user_errors")
        else:
            _apply(txn, runner, timer.key, outcome)
            runner.count("timers_fired")


def fire_timers_at_end(
    plan: BatchPlan, spec: ComputationSpec, runner: _KeyRunner, txn: Any, stored: list[Timer]
) -> None:
    """4b. Event timers due at the batch's end watermark (`BatchPlan.end_watermark`), after
    the records: stored ones and those the records just set. Once the batch's records are
    applied, no input older than that watermark is still to come, so a window whose end it
    passed closes in this batch rather than one trigger later."""
    if plan.end_watermark is None:
        return
    end = plan.end_watermark.event
    due = {(t.key, t.tag): t for t in stored}
    for key, tag, domain, time_, hold in txn.set_timers():
        if domain is TimeDomain.EVENT and time_ <= end:
            due[(key, tag)] = Timer(key, tag, time_, domain, hold)
    if due:
        runner.low_watermark = end
        fire_timers(plan, spec, runner, txn, list(due.values()))


def run_records(
    plan: BatchPlan,
    spec: ComputationSpec,
    runner: _KeyRunner,
    txn: Any,
    fresh: list[tuple[TaskInput, Record, bytes]],
) -> None:
    """4. User code per fresh record; bad input and user errors become dead letters, late
    records are counted (then dropped or flagged)."""
    wm = plan.input_watermark.event
    for item, record, _ in fresh:
        error = item.error if item.error is not None else _rejected(plan, item.row)
        if error is not None:
            txn.checkpoint(dead_letter(plan, spec, record.key, error, item.row))
            runner.count("dead_letters")
            continue
        if record.timestamp is not None and record.timestamp < wm:
            runner.count("late")
            runner.count(f"late:{record.stream}")  # per injected stream
            if spec.options.late == "drop":
                continue
            record = dataclasses.replace(record, late=True)
        outcome = runner.call(record.key, spec.computation.process_record, record)
        if isinstance(outcome, Exception):
            txn.checkpoint(
                dead_letter(
                    plan, spec, record.key, f"{type(outcome).__name__}: {outcome}", item.row
                )
            )
            runner.count("dead_letters")
            runner.count("user_errors")
        else:
            _apply(txn, runner, record.key, outcome)
            runner.count("records")


def deliver_weak(
    plan: BatchPlan, spec: ComputationSpec, store: ShardStore, runner: _KeyRunner, txn: Any
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
            txn.checkpoint(production)
        runner.count("weak_stragglers", len(runner.weak))


def commit(
    store: ShardStore,
    txn: Any,
    runner: _KeyRunner,
    fresh: list[tuple[TaskInput, Record, bytes]],
    gc_watermark: int,
) -> None:
    """5. One guarded commit: state, timers, record ids, checkpoints and counters, or nothing
    (FencedError when a newer owner holds the lease)."""
    bucket_of = store.bucket_of
    txn.add_ids([(bucket_of(r.system_time), r.id, position) for _, r, position in fresh])
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
    runner.count("productions", len(txn.productions))
    for name, amount in runner.counters.items():
        txn.count(name, amount)
    if not txn.is_empty():
        store.commit(txn)


def deliver_and_acknowledge(
    plan: BatchPlan,
    spec: ComputationSpec,
    store: ShardStore,
    runner: _KeyRunner,
    outstanding: list[Production],
    pending: list[Production],
) -> None:
    """Delivery from the task itself (`BatchPlan.deliver_in_task`): deliver, then acknowledge
    in a second guarded commit. A failed delivery leaves the checkpoints: the shard's next
    batch (or next owner) delivers them again, and they hold the watermark meanwhile."""
    try:
        delivered = deliver_all(plan, spec.name, store.keys.shard, outstanding)
    except ConfigurationError:
        raise
    except (MillstreamError, KafkaException) as exc:
        log.warning("shard %s: delivery failed, will retry: %s", store.keys.tag, exc)
        runner.count("delivery_failures")
        return
    ack = store.begin()
    ack.ack(delivered)
    ack.count("delivered", len(delivered))
    store.commit(ack)
    runner.count("delivered", len(delivered))
    runner.count("redelivered", len(pending))


def _random_id() -> bytes:
    return uuid.uuid4().bytes


def _apply(txn: Any, runner: _KeyRunner, key: str, ctx: Context) -> None:
    changed, blob = ctx.state_effect()
    if changed:
        runner.states[key] = blob
        if blob is None:
            txn.delete_state(key)
        else:
            txn.set_state(key, blob)
    for tag, spec in ctx.timer_ops.items():
        if spec is None:
            txn.delete_timer(key, tag)
        else:
            txn.set_timer(key, tag, spec[1], spec[0], spec[2])
    for production in ctx.productions:
        if runner.weak is not None and production.stream not in runner.plan.handed_streams:
            runner.weak.append(production)  # delivered before the commit (weak productions)
        else:
            txn.checkpoint(production)
