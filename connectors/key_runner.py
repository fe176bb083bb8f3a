"""Calls into an operator's code for one shard's batch, and what their outcomes write.

Every operator (a hand-written `Computation`, a window, later a join) runs its code through a
`KeyRunner`: a call gets a fresh `Context` on the key's current state, is retried
(MILLSTREAM_USER_RETRIES), and either its effects go into the shard's transaction
(`apply`) or the records that caused it become dead letters with the reason. So the
exactly-once argument (every effect in the one lease-guarded commit with the ids of the
records that caused it) is made once, here and in `shard_task`, for every operator.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from millstream.connectors.computation import Context
from millstream.connectors.plan import BatchPlan
from millstream.connectors.production_ids import new_production_id
from millstream.connectors.serde import serde_named
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec
from millstream.errors import MillstreamError
from millstream.headers import visible_headers
from millstream.records import Production, Record, TimeDomain, Timer

# A dead letter carries at most this much of the record's value (its size is given): an
# oversized record must not make an undeliverable dead letter.
DEAD_LETTER_VALUE_BYTES = 16 * 1024

# Column positions of injectors.schema.INJECTED_SCHEMA (a row's fields, as routed).
STREAM, ID, KEY, VALUE, TS, SYSTEM, SOURCE, PARTITION, OFFSET, HEADERS, ERROR = range(11)


class Effects(Protocol):
    """The part of a shard transaction an operator's outcomes write to (a `ShardTransaction`
    in the runtime, an in-memory store in `TopologyTestDriver`)."""

    def set_state(self, key: str, value: bytes) -> None: ...
    def delete_state(self, key: str) -> None: ...
    def set_timer(
        self, key: str, tag: str, time: int, domain: TimeDomain, hold: int | None = None
    ) -> None: ...
    def delete_timer(self, key: str, tag: str) -> None: ...
    def checkpoint(self, production: Production) -> Production: ...


def rejected(plan: BatchPlan, row: tuple) -> str | None:
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
            timestamp=row[TS],
            **_bytes_field("value", value[:DEAD_LETTER_VALUE_BYTES]),
        )
        if row[KEY] is not None:
            body.update(_bytes_field("record_key", row[KEY]))
        headers = visible_headers(row[HEADERS])
        if headers:
            body["headers_base64"] = [[n, base64.b64encode(v).decode()] for n, v in headers]
        if len(value) > DEAD_LETTER_VALUE_BYTES:
            body.update(value_bytes=len(value), value_truncated=True)
        if row[TS] is not None and 0 <= row[TS] <= plan.now + plan.max_future_ms:
            timestamp = row[TS]
    return Production(
        stream=DEAD_LETTERS,
        key=key,
        value=json.dumps(body, sort_keys=True).encode(),
        timestamp=timestamp,
        id=new_production_id(),
        system_time=plan.now,
    )


def _bytes_field(name: str, raw: bytes) -> dict[str, str]:
    """Bytes in a dead letter's JSON, exactly (so `millstream dead-letters --replay` gives
    back what the injector read): UTF-8 as text; anything else also as `<name>_base64`,
    beside a readable rendering."""
    try:
        return {name: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            name: raw.decode("utf-8", "backslashreplace"),
            f"{name}_base64": base64.b64encode(raw).decode(),
        }


def _timer_body(timer: Timer) -> dict[str, Any]:
    return {"tag": timer.tag, "time": timer.time, "domain": timer.domain.value, "hold": timer.hold}


class KeyRunner:
    """Runs operator code for one shard's batch, key by key, writing outcomes to `txn`."""

    def __init__(
        self, plan: BatchPlan, spec: ComputationSpec, states: dict[str, bytes | None], txn: Effects
    ):
        self.plan = plan
        self.spec = spec
        self.states = states
        self.txn = txn
        self.serde = serde_named(spec.options.serde)
        self.counters: dict[str, int] = {}
        # An operator's work collected over the shard batch, for its `before_commit`.
        self.scratch: dict[str, Any] = {}
        weak = spec.options.productions == "weak"
        self.weak: list[Production] | None = [] if weak else None
        # What user code sees as the low watermark: the batch's input watermark, then its end
        # watermark for the timers that fire after the records.
        self.low_watermark = plan.input_watermark.event

    def _id_factory(self, origin: Record | Timer) -> Callable[[], bytes]:
        """Strong productions get random ids, fixed when checkpointed. Weak productions are sent
        before the commit, so a re-run must re-emit the same ids for consumers to drop: they
        derive from what triggered them (record id, or timer) and their index in the call."""
        if self.weak is None:
            return new_production_id
        if isinstance(origin, Record):
            seed = b"r" + origin.id
        else:
            seed = f"t{origin.key}\x1f{origin.tag}\x1f{origin.time}".encode()
        base = hashlib.blake2b(self.spec.name.encode() + b"\x00" + seed, digest_size=12).digest()
        counter = iter(range(1 << 30))
        return lambda: base + next(counter).to_bytes(4, "big")

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def call(self, key: str, fn: Callable[[Context, Any], None], arg: Record | Timer) -> Any:
        """Call operator code with retries; returns the successful context or the last error.

        `arg` is the cause: a record (productions stamped at or after its timestamp) or a timer
        (at or after its output time). An operator that handles a key's batch of records at
        once passes the earliest of them."""
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

    # --- outcomes ----------------------------------------------------------------------------
    def apply(self, key: str, ctx: Context) -> None:
        """A successful call's effects, into the transaction (productions checkpointed, or
        kept for delivery before the commit when weak)."""
        changed, blob = ctx.state_effect()
        if changed:
            self.states[key] = blob
            if blob is None:
                self.txn.delete_state(key)
            else:
                self.txn.set_state(key, blob)
        for tag, spec in ctx.timer_ops.items():
            if spec is None:
                self.txn.delete_timer(key, tag)
            else:
                self.txn.set_timer(key, tag, spec[1], spec[0], spec[2])
        for production in ctx.productions:
            if self.weak is not None and production.stream not in self.plan.handed_streams:
                self.weak.append(production)  # delivered before the commit (weak productions)
            else:
                self.txn.checkpoint(production)
        for name, amount in ctx.counters.items():
            self.count(name, amount)

    def dead_letter(self, key: str, reason: str, row: tuple | None, **extra: Any) -> None:
        self.txn.checkpoint(dead_letter(self.plan, self.spec, key, reason, row, **extra))
        self.count("dead_letters")

    def late(self, record: Record, row: tuple, watermark: int) -> Record | None:
        """A record its operator found expired: counted (`late`, `late:<stream>`), then, by the
        computation's `late` option, dropped (None), dead-lettered (None) or flagged."""
        self.count("late")
        self.count(f"late:{record.stream}")  # per injected stream
        policy = self.spec.options.late
        if policy == "dead-letter":
            reason = (
                f"late: event time {record.timestamp} is behind the input low watermark "
                f"{watermark} (late='dead-letter')"
            )
            self.dead_letter(record.key, reason, row)
        if policy != "flag":
            return None
        return dataclasses.replace(record, late=True)

    def run_record(
        self, key: str, fn: Callable[[Context, Any], None], record: Record, row: tuple
    ) -> None:
        """One record through `fn`: applied, or a dead letter naming the error."""
        outcome = self.call(key, fn, record)
        if isinstance(outcome, Exception):
            self.dead_letter(key, f"{type(outcome).__name__}: {outcome}", row)
            self.count("user_errors")
        else:
            self.apply(key, outcome)
            self.count("records")

    def run_records(
        self,
        key: str,
        fn: Callable[[Context, Any], None],
        cause: Record,
        rows: Sequence[tuple],
    ) -> bool:
        """One call for a key's batch of records (`rows`, caused by `cause`, the earliest):
        applied, or every record of the batch a dead letter naming the error. True if
        applied."""
        outcome = self.call(key, fn, cause)
        if isinstance(outcome, Exception):
            reason = f"{type(outcome).__name__}: {outcome}"
            for row in rows:
                self.dead_letter(key, reason, row)
            self.count("user_errors")
            return False
        self.apply(key, outcome)
        self.count("records", len(rows))
        return True

    def run_timer(self, fn: Callable[[Context, Any], None], timer: Timer) -> None:
        """One timer through `fn`: applied, or a dead letter naming the error and the timer."""
        outcome = self.call(timer.key, fn, timer)
        if isinstance(outcome, Exception):
            reason = f"{type(outcome).__name__}: {outcome}"
            self.dead_letter(timer.key, reason, None, timer=_timer_body(timer))
            self.count("user_errors")
        else:
            self.apply(timer.key, outcome)
            self.count("timers_fired")
