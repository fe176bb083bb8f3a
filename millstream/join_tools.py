"""`millstream join verify` and `recover`: Photon's verifier over pipelines sharing a registry.

Verify, for the primary events (clicks) of a time range: every click id read from the primary
stream's topics against the union of every pipeline's joined output (read_committed,
deduplicated by production id as a consumer does). A click output twice is an at-most-once
violation. A click not output is looked up: registered with a token whose checkpoint still
exists is *in flight* (its pipeline delivers it); registered with no checkpoint and no output
is an *orphan* (the output was lost after the insert); not registered, it is *waiting* (its
query not found yet), *unjoined* (given up, in the unjoined stream) or *missing*.

The order of the reads makes the orphan verdict safe: outputs are read, then the registry and
the checkpoints, then the outputs again. A checkpoint is deleted only after its delivery, so a
click whose checkpoint was gone at the second step and that is absent from the second read was
never delivered.

Recover releases each orphan's registry entry by its token (a wrong token releases nothing)
and queues the click again for the joiner of one pipeline (`state/replay.py`, under a record id
derived from the token), which joins and registers it afresh.

A pipeline that is gone for good (its datacenter lost, its processes killed and never
restarted) leaves the clicks it registered and had not delivered in flight forever: their
checkpoints wait in its state for a restart that does not come. `recover --abandon APP` treats
them as orphans, only once APP has no live holder (`state/holder.py`: no heartbeat for
`TTL_MS`). It stays at most once when APP does come back: each of its deliveries inserts its
token first, finds the other pipeline's, and is acknowledged as a lost race. A process paused
(not dead) between its insert and its output for longer than the heartbeat's lapse would output
after the release: a transactional output is fenced first (`fence_outputs`), an internal
stream's cannot be, and verify then reports that click as output twice. So abandon only
pipelines whose processes are gone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from millstream.connectors.join_operator import JoinOperator
from millstream.connectors.plan import shard_of
from millstream.connectors.topology import ComputationSpec, Topology
from millstream.errors import ConfigurationError
from millstream.headers import HEADER_ID
from millstream.state import holder, replay
from millstream.state.client import RedisClient, connect
from millstream.state.keys import ShardKeys
from millstream.state.registry import Claim, IdRegistry
from millstream.state.shard_count import ShardLayout, read_layout
from millstream.state.watermarks import now_ms
from millstream.state_tools import shard_count
from millstream.topic_reader import read_to_end

SHOWN = 20  # ids listed per verdict in the report


@dataclass(frozen=True)
class Click:
    id: str
    timestamp: int
    key: bytes | None
    value: bytes


def find_join(topology: Topology, name: str | None) -> tuple[ComputationSpec, JoinOperator]:
    joins = {n: s for n, s in topology.computations.items() if isinstance(s.operator, JoinOperator)}
    if name is not None and name not in joins:
        raise ConfigurationError(f"the topology has no join {name!r} (joins: {sorted(joins)})")
    if name is None and len(joins) != 1:
        raise ConfigurationError(f"name the join with --join (joins: {sorted(joins)})")
    spec = joins[name or next(iter(joins))]
    assert isinstance(spec.operator, JoinOperator)
    return spec, spec.operator


def read_clicks(
    kafka: dict[str, str], topology: Topology, spec: ComputationSpec, until_ms: int
) -> dict[str, Click]:
    """The primary events with event time up to `until_ms`, by click id (the first of each)."""
    [(stream, extract)] = spec.inputs.items()
    clicks: dict[str, Click] = {}
    for source in topology.sources[stream]:
        topic = source.options.get("topics")
        if not topic:
            raise ConfigurationError(f"stream {stream!r}: only Kafka sources can be verified")
        for message in read_to_end(kafka, topic):
            ts = message.timestamp()[1]
            if ts > until_ms:
                continue
            try:
                click = extract(message.key(), message.value() or b"")
            except Exception:
                continue  # a dead letter of the joiner, not a click
            clicks.setdefault(click, Click(click, ts, message.key(), message.value() or b""))
    return clicks


def read_outputs(kafka: dict[str, str], topics: dict[str, str]) -> dict[str, list[str]]:
    """Click id -> the applications that output it, once per production id."""
    out: dict[str, list[str]] = {}
    for app, topic in topics.items():
        seen: set[bytes] = set()
        try:
            messages = list(read_to_end(kafka, topic))
        except ConfigurationError:
            continue  # this pipeline has output nothing yet
        for message in messages:
            pid = dict(message.headers() or []).get(HEADER_ID, b"")
            if pid in seen:
                continue
            seen.add(pid)
            out.setdefault(message.key().decode(), []).append(app)
    return out


@dataclass
class Verdicts:
    clicks: int = 0
    joined: int = 0
    per_app: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    in_flight: list[tuple[str, str]] = field(default_factory=list)  # (click, token)
    orphaned: list[tuple[str, str]] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    unjoined: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return not (self.violations or self.orphaned or self.missing or self.in_flight
                    or self.waiting)  # fmt: skip

    def in_flight_by_app(self) -> dict[str, int]:
        """Clicks in flight per application (the first part of each token)."""
        out: dict[str, int] = {}
        for _, token in self.in_flight:
            app = token_app(token)
            out[app] = out.get(app, 0) + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        def ids(items: list[Any]) -> list[Any]:
            return [list(i) if isinstance(i, tuple) else i for i in items[:SHOWN]]

        return {
            "exactly_once": self.exactly_once,
            "clicks": self.clicks,
            "joined": self.joined,
            "per_app": self.per_app,
            "at_most_once_violations": len(self.violations),
            "in_flight": len(self.in_flight),
            "in_flight_by_app": self.in_flight_by_app(),
            "orphaned": len(self.orphaned),
            "waiting": len(self.waiting),
            "unjoined": len(self.unjoined),
            "missing": len(self.missing),
            "examples": {
                "at_most_once_violations": ids(self.violations),
                "orphaned": ids(self.orphaned),
                "in_flight": ids(self.in_flight),
                "waiting": ids(self.waiting),
                "missing": ids(self.missing),
            },
        }


def token_app(token: str) -> str:
    """The application of a registry token `app|computation|shard|production id`."""
    return token.rsplit("|", 3)[0]


def running(redis_url: str, app: str) -> holder.Holder | None:
    """`app`'s holder when a copy of it is alive: a heartbeat within `holder.TTL_MS`, from a
    process that is not known to be gone."""
    found = holder.current(connect(redis_url), app)
    if found is None or now_ms() - found.beat >= holder.TTL_MS or found.gone_here():
        return None
    return found


def check_gone(redis_url: str, app: str) -> None:
    """Refuse to abandon an application a live copy of which still runs."""
    alive = running(redis_url, app)
    if alive is not None:
        raise ConfigurationError(
            f"--abandon {app}: it is running ({alive.describe()}); abandon only a pipeline "
            f"whose processes are gone (its heartbeat lapses {holder.TTL_MS // 1000} s after "
            "it stops)"
        )


def verify(
    topology: Topology,
    apps: list[str],
    kafka: dict[str, str],
    redis_url: str,
    join: str | None = None,
    until_ms: int | None = None,
) -> tuple[Verdicts, dict[str, Click]]:
    """The verdict on every click up to `until_ms` (module doc), and the clicks themselves."""
    spec, op = find_join(topology, join)
    until = until_ms if until_ms is not None else now_ms() - op.retry.give_up_ms - 30_000
    clicks = read_clicks(kafka, topology, spec, until)
    outputs = {a: f"{a}.{op.output}" for a in apps}
    first = read_outputs(kafka, outputs)
    client = connect(redis_url)
    registry = IdRegistry(connect(op.registry_url or redis_url), op.registry)
    candidates = [c for c in clicks.values() if c.id not in first]
    tokens = registry.holders([(c.id, c.timestamp) for c in candidates])
    pending = _checkpointed(client, [t for t in tokens if t is not None])
    second = read_outputs(kafka, outputs)
    unjoined: set[str] = set()
    for app in apps:
        with contextlib.suppress(ConfigurationError):  # nothing unjoined there yet
            unjoined |= {m.key().decode() for m in read_to_end(kafka, f"{app}.{op.unjoined}")}
    layouts = {a: read_layout(client, a, spec.name) for a in apps}
    out = Verdicts(clicks=len(clicks))
    for click in clicks.values():
        apps_out = second.get(click.id, [])
        for app in apps_out:
            out.per_app[app] = out.per_app.get(app, 0) + 1
        if len(apps_out) > 1:
            out.violations.append(click.id)
        if apps_out:
            out.joined += 1
    for click, token in zip(candidates, tokens, strict=True):
        if click.id in second:
            continue
        if token is not None:
            (out.in_flight if token in pending else out.orphaned).append((click.id, token))
        elif click.id in unjoined:
            out.unjoined.append(click.id)
        elif any(
            _waiting(client, a, spec.name, click.id, lay) for a, lay in layouts.items() if lay
        ):
            out.waiting.append(click.id)
        else:
            out.missing.append(click.id)
    return out, clicks


def _checkpointed(client: RedisClient, tokens: list[str]) -> set[str]:
    """The tokens whose production is still checkpointed (not yet acknowledged).

    Looked up under the joiner's current shard layout: a rescale moves keys only once its old
    shards have delivered every checkpoint, so a token of an older layout has none left, and
    its shard number (if the new layout has it) holds no checkpoint of that production id."""
    layouts: dict[tuple[str, str], ShardLayout | None] = {}
    parsed = []
    for token in tokens:
        app, computation, shard, hex_id = token.rsplit("|", 3)
        if (app, computation) not in layouts:
            layouts[(app, computation)] = read_layout(client, app, computation)
        layout = layouts[(app, computation)]
        generation = layout.generation if layout else 0
        keys = ShardKeys(app, computation, int(shard), generation)
        parsed.append((token, keys, bytes.fromhex(hex_id)))
    if not parsed:
        return set()
    pipe = client.pipeline(transaction=False)
    for _, keys, raw in parsed:
        pipe.hexists(keys.productions, raw)
    return {t for (t, _, _), held in zip(parsed, pipe.execute(), strict=True) if held}


def _shards(client: RedisClient, app: str, computation: str) -> int:
    try:
        return shard_count(client, app, computation)
    except ConfigurationError:
        return 0  # this application has not run


def _waiting(
    client: RedisClient, app: str, computation: str, click: str, layout: ShardLayout | None = None
) -> bool:
    """Whether `click` waits in the state of `app`'s joiner (its recorded layout, or `layout`)."""
    layout = layout or read_layout(client, app, computation)
    if layout is None:
        return False  # it never ran
    keys = ShardKeys(app, computation, shard_of(click, layout.shards), layout.generation)
    return bool(client.hexists(keys.state, click))


def recover(
    topology: Topology,
    verdicts: Verdicts,
    clicks: dict[str, Click],
    into: str,
    redis_url: str,
    join: str | None = None,
    abandon: str | None = None,
    kafka: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Release each orphan by its token and queue its click for `into`'s joiner; with
    `abandon`, that application's clicks in flight too (module doc), once it runs nowhere,
    after fencing its transactional outputs (`fence_outputs`, given `kafka`)."""
    spec, op = find_join(topology, join)
    [stream] = spec.inputs
    stranded: list[tuple[str, str]] = []
    if abandon is not None:
        if abandon == into:
            raise ConfigurationError(f"--abandon {abandon}: the clicks need another pipeline")
        check_gone(redis_url, abandon)
        stranded = [(c, t) for c, t in verdicts.in_flight if token_app(t) == abandon]
        fenced = fence_outputs(topology, spec, abandon, redis_url, kafka) if kafka else []
    registry = IdRegistry(connect(op.registry_url or redis_url), op.registry)
    orphans = [(clicks[c], token) for c, token in [*verdicts.orphaned, *stranded]]
    released = registry.release([Claim(c.id, c.timestamp, t) for c, t in orphans])
    again = [
        replay.Replay(
            letter=f"recover|{token}".encode(),
            computation=spec.name,
            stream=stream,
            key=click.key,
            value=click.value,
            timestamp=click.timestamp,
        )
        for (click, token), ok in zip(orphans, released, strict=True)
        if ok
    ]
    queued = replay.enqueue(connect(redis_url), into, again)
    return {
        "orphans": len(orphans) - len(stranded),
        "abandoned": len(stranded),
        "fenced": len(fenced) if abandon is not None and kafka else 0,
        "released": sum(released),
        "requeued": queued.queued,
        "requeued_before": queued.already,
    }


def fence_outputs(
    topology: Topology, spec: ComputationSpec, app: str, redis_url: str, kafka: Mapping[str, str]
) -> list[str]:
    """Fence every transactional producer `app`'s joiner delivers its outputs with (one per
    shard and `KafkaTransactionalSink`), so a process of it that is paused, not dead, cannot
    commit an output it registered before the release. Outputs to other sinks (an internal
    stream's idempotent producer) cannot be fenced. Returns the transactional ids fenced."""
    from millstream.sinks.base import ShardRef
    from millstream.sinks.kafka_transactional import KafkaTransactionalSink

    sinks = [topology.sinks.get(s) for s in spec.outputs]
    transactional = [s for s in sinks if isinstance(s, KafkaTransactionalSink)]
    if not transactional:
        return []
    shards = _shards(connect(redis_url), app, spec.name)  # 0: it never ran, nothing to fence
    fenced: set[str] = set()
    for sink in transactional:
        bound = sink.bind(kafka)
        fenced |= {bound.fence(ShardRef(app, spec.name, s)) for s in range(shards)}
    return sorted(fenced)


def render(verdicts: Verdicts) -> str:
    data = verdicts.as_dict()
    lines = [
        f"{'exactly once' if data['exactly_once'] else 'NOT exactly once'}: {data['clicks']} "
        f"clicks, {data['joined']} joined ({data['per_app']}), "
        f"{data['at_most_once_violations']} output twice, {data['in_flight']} in flight, "
        f"{data['orphaned']} orphaned, {data['waiting']} waiting, {data['unjoined']} unjoined, "
        f"{data['missing']} missing"
    ]
    for name, items in data["examples"].items():
        if items:
            lines.append(f"  {name}: {json.dumps(items)}")
    return "\n".join(lines)
