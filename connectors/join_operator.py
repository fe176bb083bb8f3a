"""Photon's join (seed 004) as two operators: the event store's writer and the joiner.

`Topology.join` declares both. The *store* computation (`<join>-store`, keyed by the secondary
event's id) writes each secondary event (a query) into the event store's cache tier
(`state/event_store.py`). The *joiner* (`<join>`, keyed by the primary event's id, a click)
looks up a shard batch's clicks in one pipelined round trip, in `before_commit`, once it has
the batch's records and due timers:

- found: the joined value (`combine(click, query)`) is checkpointed on the output stream,
  keyed by the click id and stamped at the click's event time, and the click's waiting state
  and timers go, all in the shard's one commit with the click's record id;
- not found in the cache, and its query old enough for the cache to have let it expire: looked
  for in the secondary stream's topics, all such clicks of the batch in one search (the log
  tier, `connectors/join_log.py`); found there, joined as above;
- not found: the click waits in state with a wall-time retry timer (exponential backoff with
  jitter derived from the click id, so a re-run is deterministic) and an event-time give-up
  timer at `click time + give_up_ms` (from the joiner's low watermark for a click already
  behind it) that holds the joiner's low watermark at the click's time
  (its joined output, stamped there, is not late downstream); each retry looks again; when the
  low watermark passes the give-up time the click goes to the `unjoined` stream with the reason.

Output is registry-gated at delivery (`before_delivery`, called by the settlement): each joined
production's click id is inserted in the IdRegistry (`state/registry.py`) with the token
`app|joiner|shard|production id`, fixed at the checkpoint. Inserted or already ours: delivered.
Someone else's (another pipeline, or this one for a click seen twice under two record ids):
acknowledged without delivery and counted as a lost race. So at every moment at most one
joined output exists per click, across every pipeline sharing the registry.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mmh3

from millstream.connectors import _json
from millstream.connectors.join_log import JoinLog, LogLookup, LookupTime, look_in_log, query_time
from millstream.connectors.operator import KeyBatch, Operator
from millstream.connectors.production_ids import new_production_id
from millstream.connectors.throttle import Throttle
from millstream.errors import ConfigurationError
from millstream.fault_points import fault_point
from millstream.records import Production, Record, TimeDomain, Timer
from millstream.state import event_store
from millstream.state.client import connect
from millstream.state.registry import DAY_MS, Claim, IdRegistry, Outcome

if TYPE_CHECKING:
    from millstream.connectors.key_runner import KeyRunner
    from millstream.connectors.plan import BatchPlan

RETRY, GIVE_UP = "retry", "give-up"
REGISTRY_RETENTION_DAYS = 7  # IdRegistry entries live this long after their event's day
RETENTION_MARGIN_MS = 3_600_000  # a click this close to it is refused: its output might not be
log = logging.getLogger(__name__)
Combine = Callable[[Record, bytes], Any]
Lookup = Callable[[bytes | None, bytes], str]


@dataclass(frozen=True)
class JoinRetry:
    """How a click whose query is not there yet waits: the first retry after `first_ms`,
    doubling up to `max_ms` (plus up to a quarter of jitter), until `give_up_ms` after the
    click's event time has passed in the low watermark."""

    first_ms: int = 250
    max_ms: int = 5_000
    give_up_ms: int = 60_000

    def validate(self, join: str) -> None:
        for name in ("first_ms", "max_ms", "give_up_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"join {join!r}: retry {name} must be an int >= 1")
        if self.max_ms < self.first_ms:
            raise ConfigurationError(f"join {join!r}: retry max_ms is below first_ms")

    def delay(self, attempt: int, click: str) -> int:
        base = min(self.max_ms, self.first_ms << min(attempt, 30))
        return base + mmh3.hash(f"{click}\x00{attempt}", signed=False) % (base // 4 + 1)


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return _json.dumps(value)  # compact, sorted keys: json.dumps's output, faster


def _scratch(runner: KeyRunner, name: str) -> list[Any]:
    """This shard batch's collected work (a runner lives for one shard batch)."""
    return runner.scratch.setdefault(name, [])  # type: ignore[no-any-return]


class EventStoreOperator(Operator):
    """Writes the secondary stream's events into the event store, by id, with a TTL."""

    late_policies = ("drop",)

    def __init__(self, store: str, ttl_s: int) -> None:
        self.store = store
        self.ttl_s = ttl_s

    def expired(self, record: Record, watermark: int) -> bool:
        return False  # a late query is still looked up by the clicks that name it

    def process_key(self, runner: KeyRunner, key: str, batch: KeyBatch) -> None:
        _scratch(runner, "events").append((key, batch[-1][0].value))
        runner.count("records", len(batch))

    def before_commit(self, runner: KeyRunner) -> None:
        events = runner.scratch.get("events")
        if events:
            event_store.put(connect(runner.plan.redis_url), self.store, events, self.ttl_s)
            runner.count("stored", len(events))


class JoinOperator(Operator):
    """Joins each primary event with the secondary event its `lookup` names (module doc)."""

    late_policies = ("drop",)

    def __init__(
        self,
        *,
        store: str,
        lookup: Lookup,
        combine: Combine,
        output: str,
        unjoined: str,
        registry: str,
        registry_url: str | None,
        retry: JoinRetry,
        primary: str = "",
        max_waiting: int | None = None,
        secondary: str = "",
        secondary_id: Lookup | None = None,
        cache_ttl_s: int = 3600,
        log_tier: JoinLog | None = None,
        lookup_time: LookupTime | None = None,
    ) -> None:
        self.store = store
        self.lookup = lookup
        self.combine = combine
        self.output = output
        self.unjoined = unjoined
        self.registry = registry
        self.registry_url = registry_url
        self.retry = retry
        self.primary = primary
        self.max_waiting = max_waiting
        self.gated_streams = (output,)
        # The log tier (connectors/join_log.py): its topics are bound at start.
        self.secondary = secondary
        self.secondary_id = secondary_id
        self.cache_ttl_s = cache_ttl_s
        self.log_tier = log_tier
        self.lookup_time = lookup_time
        self.log_sources: tuple[Any, ...] = ()

    def throttle(self) -> Throttle | None:
        """Photon's bound on waiting clicks: the primary pauses above `max_waiting` a shard."""
        if self.max_waiting is None or not self.primary:
            return None
        return Throttle((self.primary,), self.max_waiting, self.retry.give_up_ms)

    def read_ahead(self) -> tuple[str, ...]:
        """A backlog of clicks and queries (a restart, an outage): queries read first find
        their clicks in the same batch; read at the clicks' pace, a query that sits deeper in
        its partition than its click in the click's makes the click wait a retry."""
        return (self.secondary,) if self.secondary else ()

    def user_objects(self) -> list[Any]:
        objects = (self.lookup, self.combine, self.secondary_id, self.lookup_time)
        return [f for f in objects if f is not None]

    def _log_lookup(self) -> LogLookup | None:
        if self.log_tier is None or not self.log_sources or self.secondary_id is None:
            return None
        return LogLookup(self.log_tier, self.log_sources, self.secondary_id, self.store,
                         self.cache_ttl_s)  # fmt: skip

    def expired(self, record: Record, watermark: int) -> bool:
        return False  # every click is joined; its output is stamped at its own time

    # --- collect the batch's work ------------------------------------------------------------
    def process_key(self, runner: KeyRunner, key: str, batch: KeyBatch) -> None:
        for record, row in batch:
            _scratch(runner, "records").append((key, record, row))

    def process_timer(self, runner: KeyRunner, timer: Timer) -> None:
        _scratch(runner, "timers").append(timer)

    # --- one look-up for all of it, then the effects -------------------------------------------
    def before_commit(self, runner: KeyRunner) -> None:
        records: list[tuple[str, Record, tuple]] = runner.scratch.get("records", [])
        timers: list[Timer] = runner.scratch.get("timers", [])
        if not records and not timers:
            return
        waiting: dict[str, dict[str, Any]] = {}
        for key in {t.key for t in timers} | {k for k, _, _ in records}:
            raw = runner.states.get(key)
            if raw is not None:
                waiting[key] = _json.loads(raw)
        wanted: dict[str, str] = {}  # click -> query id
        times: dict[str, int] = {}  # click -> its query's time (the log tier's search)
        fresh: list[tuple[str, Record, tuple, str]] = []
        for key, record, row in records:
            if key in waiting or key in wanted:
                runner.count("duplicate_clicks")  # the same click id again, another record id
                continue
            if self._past_retention(record.timestamp, runner.plan.now + RETENTION_MARGIN_MS):
                reason = (
                    f"join: click time {record.timestamp} is past the IdRegistry's "
                    f"{REGISTRY_RETENTION_DAYS}-day retention: it cannot be registered, so it "
                    "cannot be output at most once"
                )
                runner.dead_letter(key, reason, row)
                continue
            try:
                query = self.lookup(row[2], record.value)  # the Kafka key, the value
                times[key] = query_time(self.lookup_time, record)
            except Exception as exc:
                runner.dead_letter(key, f"join lookup: {type(exc).__name__}: {exc}", row)
                continue
            wanted[key] = query
            fresh.append((key, record, row, query))
        for timer in timers:
            state = waiting.get(timer.key)
            if state is not None:
                wanted.setdefault(timer.key, state["q"])
                times.setdefault(timer.key, state.get("qt", state["ts"]))
        ids = list(wanted)
        found = dict(
            zip(ids, event_store.get(connect(runner.plan.redis_url), self.store,
                                     [wanted[i] for i in ids]), strict=True)
        )  # fmt: skip
        runner.count("lookups", len(ids))
        lookup = self._log_lookup()
        if lookup is not None:
            misses = {i: (wanted[i], times[i]) for i in ids if found[i] is None}
            found.update(look_in_log(runner, lookup, misses))
        for key, record, row, query in fresh:
            value = found.get(key)
            if value is not None:
                self._joined(runner, key, record.timestamp, record.value, value, row)
            else:
                self._wait(runner, key, record, query, times[key])
        by_key: dict[str, list[Timer]] = {}
        for timer in timers:
            by_key.setdefault(timer.key, []).append(timer)
        for key, fired in by_key.items():
            state = waiting.get(key)
            if state is None:
                continue  # joined or given up earlier in this batch
            value = found.get(key)
            if value is not None:
                click = base64.b64decode(state["v"])
                self._joined(runner, key, state["ts"], click, value, None)
                runner.count("joined_on_retry")
            elif any(t.tag == GIVE_UP for t in fired):
                self._give_up(runner, key, state)
            else:
                state["n"] += 1
                runner.count("retries")
                blob = _json.dumps(state)
                runner.txn.set_state(key, blob)
                runner.states[key] = blob
                at = runner.plan.now + self.retry.delay(state["n"], key)
                runner.txn.set_timer(key, RETRY, at, TimeDomain.WALL)

    def _wait(self, runner: KeyRunner, key: str, record: Record, query: str, at: int) -> None:
        state = {
            "q": query,
            "qt": at,
            "ts": record.timestamp,
            "v": base64.b64encode(record.value).decode(),
            "n": 0,
            "since": runner.plan.now,
        }
        blob = _json.dumps(state)
        runner.txn.set_state(key, blob)
        runner.states[key] = blob
        runner.txn.set_timer(
            key, RETRY, runner.plan.now + self.retry.delay(0, key), TimeDomain.WALL
        )
        hold = max(record.timestamp, runner.plan.output_watermark)
        runner.txn.set_timer(key, GIVE_UP, hold + self.retry.give_up_ms, TimeDomain.EVENT, hold)
        runner.count("waiting")

    def _joined(
        self,
        runner: KeyRunner,
        key: str,
        timestamp: int,
        click: bytes,
        query: bytes,
        row: tuple | None,
    ) -> None:
        record = Record(
            key=key,
            value=click,
            timestamp=timestamp,
            id=b"",
            system_time=runner.plan.now,
        )
        error: Exception | None = None
        for _ in range(runner.plan.user_retries + 1):
            try:
                value = _encode(self.combine(record, query))
                break
            except Exception as exc:
                error = exc
        else:
            reason = f"join combine: {type(error).__name__}: {error}"
            runner.dead_letter(key, reason, row, click=click.decode("utf-8", "backslashreplace"))
            self._forget(runner, key)
            return
        runner.txn.checkpoint(
            Production(
                stream=self.output, key=key, value=value, timestamp=timestamp,
                id=new_production_id(), system_time=runner.plan.now,
            )
        )  # fmt: skip
        self._forget(runner, key)
        runner.count("joined")

    def _give_up(self, runner: KeyRunner, key: str, state: dict[str, Any]) -> None:
        body = {
            "id": key,
            "query": state["q"],
            "reason": f"no event {state['q']!r} in the event store after {state['n'] + 1} "
            f"look-ups over {(runner.plan.now - state['since']) / 1000:.1f} s",
            "click": base64.b64decode(state["v"]).decode("utf-8", "backslashreplace"),
        }
        runner.txn.checkpoint(
            Production(
                stream=self.unjoined, key=key, value=_encode(body), timestamp=state["ts"],
                id=new_production_id(), system_time=runner.plan.now,
            )
        )  # fmt: skip
        self._forget(runner, key)
        runner.count("unjoined")

    def _forget(self, runner: KeyRunner, key: str) -> None:
        """A waiting click's state and timers go (`_wait` sets them together). A click joined
        at its first look-up never had any: nothing to delete in the commit."""
        if runner.states.get(key) is None:
            return
        runner.txn.delete_state(key)
        runner.states[key] = None
        runner.txn.delete_timer(key, RETRY)
        runner.txn.delete_timer(key, GIVE_UP)

    @staticmethod
    def _past_retention(event_ms: int, at_ms: int) -> bool:
        """The registry bucket of `event_ms` is gone by `at_ms` (`IdRegistry.expire_at`)."""
        return (event_ms // DAY_MS + 1 + REGISTRY_RETENTION_DAYS) * DAY_MS <= at_ms

    # --- the registry gate -------------------------------------------------------------------
    def before_delivery(
        self, plan: BatchPlan, computation: str, shard: int, productions: Sequence[Production]
    ) -> tuple[list[Production], list[Production], dict[str, int]]:
        """Joined output only after its click id is registered by this production's token."""
        joined = [p for p in productions if p.stream == self.output]
        if not joined:
            return list(productions), [], {}
        registry = IdRegistry(
            connect(self.registry_url or plan.redis_url), self.registry,
            retention_days=REGISTRY_RETENTION_DAYS,
        )  # fmt: skip
        # Past the retention while waiting for delivery (the joiner refuses older clicks):
        # registering is impossible, so they are not output; counted and logged.
        expired = {p.id for p in joined if self._past_retention(p.timestamp, plan.now)}
        if expired:
            log.warning(
                "join %s: %d joined outputs passed the IdRegistry's %d-day retention before "
                "delivery; not output (past_retention)", computation, len(expired),
                REGISTRY_RETENTION_DAYS,
            )  # fmt: skip
            joined = [p for p in joined if p.id not in expired]
        prefix = f"{plan.app}|{computation}|{shard}|"
        answers = registry.insert(
            [Claim(p.key, p.timestamp, prefix + p.id.hex()) for p in joined], plan.now
        )
        outcomes = [a.outcome for a in answers]
        lost = {p.id for p, o in zip(joined, outcomes, strict=True) if o is Outcome.THEIRS}
        lost |= expired
        deliver = [p for p in productions if p.id not in lost]
        skipped = [p for p in productions if p.id in lost]
        counts = {
            "lost_races": len(skipped) - len(expired),
            "past_retention": len(expired),
            "registered": outcomes.count(Outcome.INSERTED),
            # Inserted before a crash, delivered only now: Photon's lost-output window, closed.
            "registered_before": outcomes.count(Outcome.OURS),
            # The gate's cost: round trips per shard batch stay one however many clicks.
            "registry_batches": 1,
            "registry_round_trips": registry.round_trips,
            "registry_commands": registry.commands,
        }
        if len(lost) < len(joined):
            fault_point("after_registry_insert")  # registered, not delivered yet
        return deliver, skipped, counts
