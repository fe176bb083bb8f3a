"""TopologyTestDriver: a topology run in memory, synchronously, with the runtime's rules.

For unit tests of computations: no Spark, Redis or Kafka. Records are sent one at a time; the
injected streams' low watermark and the wall clock move only when the test says so. What runs
is the runtime's own code wherever it can be: key extraction (`connectors.routing.route`), the
bad-input bounds, user-code retries and the real `Context` (`connectors.shard_task`), effects
applied as a shard commit applies them (`_apply`), dead letters built by `dead_letter`, timer
order by `state.timers.firing_order`. Only storage (dicts instead of Redis), transport (a queue
instead of Kafka topics) and the watermark estimates (set by the test) are the driver's own.

Each `send` behaves as a micro-batch of one record followed by as many (empty) batches as it
takes for nothing to be due: the record runs through its consumers, their productions through
theirs, then timers that came due fire. Sinks are not called: `output(stream)` is what they
would receive.
"""

from __future__ import annotations

import uuid
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

from millstream.connectors.formats import encode_with
from millstream.connectors.fresh_records import KeyRecords, to_record
from millstream.connectors.key_runner import KeyRunner, rejected
from millstream.connectors.plan import BatchPlan
from millstream.connectors.routing import route as _route
from millstream.connectors.serde import encode_value, serde_named
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec, Topology
from millstream.errors import ConfigurationError, MillstreamError
from millstream.headers import production_headers
from millstream.records import Production, TimeDomain, Timer
from millstream.settings import Settings
from millstream.state.shard import ShardConfig
from millstream.state.timers import firing_order
from millstream.state.watermarks import INFINITY, UNKNOWN, Watermark

__all__ = ["TopologyTestDriver"]

_DEFAULTS = Settings()
# A computation whose timers keep coming due at once (a wall timer re-set at ctx.now from its
# own firing) would never let the driver return; the runtime would fire it every batch forever.
MAX_FIRINGS_PER_STEP = 100_000


class _Node:
    """One computation's store: every key's state and timers, its record-id catalog, counters."""

    def __init__(self, spec: ComputationSpec, topology: Topology) -> None:
        self.spec = spec
        self.internal_inputs = frozenset(s for s in spec.inputs if s not in topology.sources)
        self.states: dict[str, bytes | None] = {}
        self.timers: dict[tuple[str, str], Timer] = {}
        self.seen: set[bytes] = set()
        self.counters: Counter[str] = Counter()
        self.input_watermark = UNKNOWN
        self.output_watermark = UNKNOWN


class _Effects:
    """The part of a shard transaction `KeyRunner` writes to, applied at once."""

    def __init__(self, node: _Node) -> None:
        self._node = node
        self.productions: list[Production] = []

    def set_state(self, key: str, value: bytes) -> None:
        self._node.states[key] = value

    def delete_state(self, key: str) -> None:
        self._node.states.pop(key, None)

    def set_timer(
        self, key: str, tag: str, time: int, domain: TimeDomain, hold: int | None = None
    ) -> None:
        self._node.timers[(key, tag)] = Timer(key, tag, int(time), domain, hold)

    def delete_timer(self, key: str, tag: str) -> None:
        self._node.timers.pop((key, tag), None)

    def checkpoint(self, production: Production) -> Production:
        self.productions.append(production)
        return production


class TopologyTestDriver:
    """Run `topology` in memory: `send` records, move the watermark and the clock, read outputs.

    `start_ms` is the initial wall clock (`ctx.now`, and the bound of
    MILLSTREAM_MAX_FUTURE_MS: with epoch-millisecond event times, start the clock near them,
    or records more than a day ahead of it are dead-lettered as the runtime would). The
    injected streams' low watermark starts unknown: nothing is late until `advance_watermark`.
    `user_retries` and `on_user_error` are MILLSTREAM_USER_RETRIES and MILLSTREAM_ON_USER_ERROR.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        start_ms: int = 0,
        user_retries: int = _DEFAULTS.user_retries,
        on_user_error: str = _DEFAULTS.on_user_error,
        max_record_bytes: int = _DEFAULTS.max_record_bytes,
        max_future_ms: int = _DEFAULTS.max_future_ms,
    ) -> None:
        topology.validate()
        gated = [s.name for s in topology.computations.values() if s.operator.gated_streams]
        if gated:
            raise ConfigurationError(
                f"TopologyTestDriver does not run joins yet ({gated}): their event store and "
                "IdRegistry live in Redis; test a join on the runtime (tests/e2e/test_join.py)"
            )
        if on_user_error not in ("dead-letter", "fail-stop"):
            raise ConfigurationError(
                f"on_user_error={on_user_error!r}: use 'dead-letter' or 'fail-stop'"
            )
        if user_retries < 0:
            raise ConfigurationError(f"user_retries={user_retries}: use 0 or more")
        self.topology = topology
        self._now = int(start_ms)
        self._user_retries = user_retries
        self._fail_stop = on_user_error == "fail-stop"
        self._max_record_bytes = max_record_bytes
        self._max_future_ms = max_future_ms
        self._nodes = {name: _Node(spec, topology) for name, spec in topology.computations.items()}
        self._order = [self._nodes[n] for n in _topological_order(topology)]
        self._injected: dict[str, int] = dict.fromkeys(topology.sources, UNKNOWN)
        self._outputs: dict[str, list[Production]] = {s: [] for s in topology.internal_streams()}
        self._offsets: Counter[str] = Counter()  # per stream: the next record's position
        self._queue: deque[tuple[_Node, tuple]] = deque()

    # --- driving ------------------------------------------------------------------------------
    def send(
        self,
        stream: str,
        value: bytes | str | Any,
        *,
        key: bytes | str | None = None,
        timestamp: int,
        id: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None = None,
    ) -> None:
        """Inject one record; returns once it and everything it caused has been processed.

        `key` is the Kafka record key handed to each consumer's key extractor (with the default
        extractor it is the computation's key); `id` defaults to a fresh one, and a repeated id
        is a duplicate (dropped, counted as `duplicates`). `value`: bytes as they are (a value
        the stream's format cannot decode is dead-lettered, as in the runtime); otherwise
        encoded by the stream's value format, if it has one, else str as UTF-8 and anything
        else as JSON. `headers`: the record's Kafka headers (values bytes or str); computations
        see them without the `ms-` ones, as in the runtime.
        """
        if stream not in self.topology.sources:
            raise ConfigurationError(
                f"send() to {stream!r}, which is not an injected stream (declared with "
                f"topology.source: {sorted(self.topology.sources)})"
            )
        if not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < 0:
            raise ValueError(
                f"timestamp must be int milliseconds >= 0, got {timestamp!r} (the injectors "
                f"dead-letter records without a valid timestamp before any computation sees them)"
            )
        rid = uuid.uuid4().bytes if id is None else _as_bytes(id)
        fmt = self.topology.formats.get(stream)
        row = (
            stream,
            rid,
            None if key is None else _as_bytes(key),
            encode_value(value) if fmt is None else encode_with(fmt, value),
            timestamp,
            self._now,
            stream,
            0,
            self._next_offset(stream),
            _kafka_headers(headers),
            None,
        )
        for name in self.topology.consumers_of(stream):
            self._queue.append((self._nodes[name], row))
        self._settle()

    def advance_watermark(self, ms: int, *, stream: str | None = None) -> None:
        """Set the low watermark of every injected stream (or of `stream`) to `ms`, then fire
        whatever came due, downstream computations included. Watermarks never go back."""
        streams = list(self._injected) if stream is None else [stream]
        for name in streams:
            if name not in self._injected:
                raise ConfigurationError(f"{name!r} is not an injected stream")
            if ms < self._injected[name]:
                raise ValueError(
                    f"advance_watermark({ms}): stream {name!r} is already at "
                    f"{self._injected[name]}; low watermarks never go back"
                )
        for name in streams:
            self._injected[name] = int(ms)
        self._settle()

    def advance_clock(self, ms: int) -> None:
        """Set the wall clock (`ctx.now`) to `ms`, then fire the wall timers that came due."""
        if ms < self._now:
            raise ValueError(f"advance_clock({ms}): the clock is already at {self._now}")
        self._now = int(ms)
        self._settle()

    # --- reading ------------------------------------------------------------------------------
    @property
    def now(self) -> int:
        return self._now

    def output(self, stream: str) -> list[Production]:
        """Every production to `stream` so far, in the order they were committed."""
        if stream not in self._outputs:
            raise ConfigurationError(
                f"no computation produces {stream!r} (produced streams: {sorted(self._outputs)})"
            )
        return list(self._outputs[stream])

    def dead_letters(self) -> list[Production]:
        """The dead-letter productions; each value is the runtime's JSON body (computation,
        key, error, and the record's stream, position, id and value when there is one)."""
        return self.output(DEAD_LETTERS)

    def state(self, computation: str, key: str) -> Any:
        """The key's committed state, decoded with the computation's serde; None if it has none."""
        node = self._node(computation)
        raw = node.states.get(key)
        return None if raw is None else serde_named(node.spec.options.serde).loads(raw)

    def timers(self, computation: str, key: str | None = None) -> list[Timer]:
        """Pending timers of the computation (of one key), in firing order."""
        node = self._node(computation)
        return firing_order([t for t in node.timers.values() if key is None or t.key == key])

    def late(self, computation: str) -> int:
        """Records that arrived behind the computation's input low watermark."""
        return self._node(computation).counters["late"]

    def metrics(self, computation: str) -> dict[str, int]:
        """The runtime's counter names: records, timers_fired, late, late:<stream>,
        duplicates, dead_letters, user_errors, productions."""
        return dict(self._node(computation).counters)

    def input_watermark(self, computation: str) -> int:
        return self._node(computation).input_watermark

    def low_watermark(self, computation: str) -> int:
        """The computation's output low watermark, as its consumers see it."""
        return self._node(computation).output_watermark

    # --- the runtime's steps, in memory -------------------------------------------------------
    def _node(self, computation: str) -> _Node:
        try:
            return self._nodes[computation]
        except KeyError:
            raise ConfigurationError(
                f"unknown computation {computation!r} (declared: {sorted(self._nodes)})"
            ) from None

    def _next_offset(self, stream: str) -> int:
        offset = self._offsets[stream]
        self._offsets[stream] += 1
        return offset

    def _plan(self, node: _Node) -> BatchPlan:
        """What a shard task would be told for a batch planned now."""
        return BatchPlan(
            app=self.topology.app,
            batch_id=0,
            redis_url="",
            shards=1,
            shard_config=ShardConfig(use_bloom=False),
            input_watermark=Watermark(node.input_watermark, self._now),
            gc_watermark=UNKNOWN,
            now=self._now,
            user_retries=self._user_retries,
            fail_stop=self._fail_stop,
            internal_inputs=node.internal_inputs,
            deliveries={},
            in_flight_streams=frozenset(),
            max_record_bytes=self._max_record_bytes,
            max_future_ms=self._max_future_ms,
            output_watermark=node.output_watermark,
        )

    def _settle(self) -> None:
        """Deliver everything queued, then move watermarks in topological order and fire what
        is due, until nothing moves (an upstream firing may make a downstream timer due)."""
        firings = 0
        while True:
            self._drain()
            moved = False
            for node in self._order:
                before = (node.input_watermark, node.output_watermark)
                node.input_watermark = max(node.input_watermark, self._input_of(node))
                fired = self._fire_due(node)
                firings += fired
                self._drain()
                oldest = min(
                    (t.output_time for t in node.timers.values() if t.domain is TimeDomain.EVENT),
                    default=INFINITY,
                )
                node.output_watermark = max(
                    node.output_watermark, min(node.input_watermark, oldest)
                )
                moved = (
                    moved or fired > 0 or before != (node.input_watermark, node.output_watermark)
                )
            if not moved:
                return
            if firings > MAX_FIRINGS_PER_STEP:
                raise MillstreamError(
                    f"more than {MAX_FIRINGS_PER_STEP} timer firings in one step: a timer that "
                    f"re-sets itself at a time already due never lets time move on"
                )

    def _input_of(self, node: _Node) -> int:
        """min over the inputs: injected watermark less the stream's out-of-order bound, or the
        producing computations' published watermarks (nothing is ever in flight here)."""
        parts: list[int] = []
        for stream in node.spec.inputs:
            if stream in self._injected:
                estimate = self._injected[stream]
                bound = self.topology.out_of_order_ms.get(stream, 0)
                parts.append(estimate - bound if estimate > UNKNOWN else UNKNOWN)
            else:
                parts += [
                    self._nodes[p].output_watermark for p in self.topology.producer_of(stream)
                ]
        return min(parts, default=INFINITY)

    def _drain(self) -> None:
        while self._queue:
            node, row = self._queue.popleft()
            self._process_row(node, row)

    def _process_row(self, node: _Node, row: tuple) -> None:
        """shard_task._run_once for one row: dedup, bad input, late policy, the operator."""
        spec = node.spec
        [(_, item)] = list(_route(dict(spec.inputs), 1, iter([row]), formats=spec.formats))
        record = to_record(item, node.internal_inputs)
        if spec.options.exactly_once:
            if record.id in node.seen:
                node.counters["duplicates"] += 1
                return
            node.seen.add(record.id)
        runner = self._runner(node)
        error = item.error if item.error is not None else rejected(runner.plan, row)
        operator = spec.operator
        if error is not None:
            runner.dead_letter(record.key, error, row)
        elif operator.expired(record, node.input_watermark):
            flagged = runner.late(record, row, node.input_watermark)
            if flagged is not None:
                batch = KeyRecords([item], node.internal_inputs, {0: flagged})
                operator.process_key(runner, record.key, batch)
        else:
            batch = KeyRecords([item], node.internal_inputs, {0: record})
            operator.process_key(runner, record.key, batch)
        self._finish(node, runner)

    def _fire_due(self, node: _Node) -> int:
        """One batch's timers: those due at the input watermark and the clock, in firing order.

        A timer an earlier firing of the same batch deleted or moved does not fire (see the
        report on `shard_task`, which fires what it loaded).
        """
        due = [
            t
            for t in node.timers.values()
            if t.time <= (node.input_watermark if t.domain is TimeDomain.EVENT else self._now)
        ]
        fired = 0
        for timer in firing_order(due):
            if node.timers.get((timer.key, timer.tag)) != timer:
                continue
            del node.timers[(timer.key, timer.tag)]
            runner = self._runner(node)
            node.spec.operator.process_timer(runner, timer)
            fired += 1
            self._finish(node, runner)
        return fired

    def _runner(self, node: _Node) -> KeyRunner:
        return KeyRunner(self._plan(node), node.spec, node.states, _Effects(node))

    def _finish(self, node: _Node, runner: KeyRunner) -> None:
        """What the call wrote is committed: its counters, then its productions emitted."""
        node.counters.update(runner.counters)
        assert isinstance(runner.txn, _Effects)
        self._emit(node, [*runner.txn.productions, *(runner.weak or [])])

    def _emit(self, node: _Node, productions: list[Production]) -> None:
        """Record each production on its stream and queue it for the stream's consumers, as
        the internal-stream sink writes it (key as the Kafka key, id and times in headers)."""
        for production in productions:
            node.counters["productions"] += 1
            self._outputs[production.stream].append(production)
            consumers = self.topology.consumers_of(production.stream)
            if not consumers:
                continue
            row = (
                production.stream,
                production.id,
                production.key.encode("utf-8"),
                production.value,
                production.timestamp,
                production.system_time,
                self.topology.topic_of(production.stream),
                0,
                self._next_offset(production.stream),
                production_headers(production),
                None,
            )
            for name in consumers:
                self._queue.append((self._nodes[name], row))


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _kafka_headers(
    headers: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None,
) -> list[tuple[str, bytes]] | None:
    """An injected record's headers as the Kafka injector's row holds them. Any name goes (a
    Kafka topic's records may carry `ms-` headers, which computations do not see)."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(name), _as_bytes(value)) for name, value in items]


def _topological_order(topology: Topology) -> list[str]:
    """Computations with producers before consumers (declaration order among equals; a cycle,
    which no watermark can get past, keeps declaration order)."""
    names = list(topology.computations)
    upstream = {
        name: {
            p
            for stream in spec.inputs
            for p in topology.producer_of(stream)
            if stream not in topology.sources and p != name
        }
        for name, spec in topology.computations.items()
    }
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and upstream[n] <= set(ordered)]
        if not ready:  # a cycle: the rest in declaration order
            ordered += [n for n in names if n not in ordered]
            break
        ordered.append(ready[0])
    return ordered
