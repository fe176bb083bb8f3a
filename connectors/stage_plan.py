"""A fused query's plan as data: one `Stage` per computation, built by small named passes.

The shape of Beam's `fn_api_runner/translations.py`: the plan starts as one bare stage per
computation and each pass `(stages, context) -> stages` decides one thing, in order:

1. `fusion_order`: producers before consumers (a cycle cannot run in one pass of a batch);
2. `hand_over`: which computations of this query consume each output (handed over inside the
   batch), and which outputs computations of other queries read (from the stream's topic);
3. `delivery_targets`: where each output goes outside the query (its sink, its topic);
4. `topic_inputs`: inputs produced by computations of other queries, read from their topics;
5. `event_logs`: a join's log tier bound to its secondary stream's Kafka sources.

Adding an operator's rewrite (lifting across stages, a join's registry, a shard map for
rescaling) is adding one pass to `PASSES`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from millstream.connectors.delivery import Target
from millstream.connectors.plan import BatchPlan
from millstream.connectors.targets import Endpoints, InternalStreamSink, UserSink
from millstream.connectors.topology import DEAD_LETTERS, ComputationSpec, Topology
from millstream.errors import ConfigurationError
from millstream.settings import Settings
from millstream.state.keys import ShardKeys, app_key
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import Watermark

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """One computation's wiring inside a fused query."""

    spec: ComputationSpec
    shards: int
    config: ShardConfig
    metrics_key: str
    targets: dict[str, tuple[Target, ...]] = field(default_factory=dict)  # outside the query
    consumers: dict[str, list[str]] = field(default_factory=dict)  # stream -> readers here
    # Output streams that computations of another query read (from the stream's topic): their
    # deliveries are recorded in flight, to hold those consumers' watermarks.
    elsewhere: frozenset[str] = frozenset()
    # Inputs produced by computations of another query: read from their topics.
    topic_inputs: frozenset[str] = frozenset()
    last_batch: dict[str, Any] = field(default_factory=dict)
    # The recorded layout's generation (`state/shard_count.py`); it and `shards` change in
    # place when a rescale is applied between batches (`connectors/rescaling.py`).
    generation: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def keys(self, app: str) -> list[ShardKeys]:
        return [ShardKeys(app, self.name, s, self.generation) for s in range(self.shards)]


@dataclass(frozen=True)
class PlanContext:
    """What the passes read: the application, its settings and where its services are."""

    topology: Topology
    settings: Settings
    endpoints: Endpoints


Pass = Callable[[list[Stage], PlanContext], list[Stage]]


def topological_order(topology: Topology, names: Sequence[str]) -> list[str]:
    """Producers before consumers (Kahn's algorithm, declaration order among equals).

    A cycle cannot run in one pass of a batch: refused with the computations on it.
    """
    chosen = [n for n in topology.computations if n in set(names)]
    upstream = {
        n: {p for s in topology.computations[n].inputs for p in topology.producer_of(s)} & set(chosen)
        for n in chosen
    }  # fmt: skip
    order: list[str] = []
    while len(order) < len(chosen):
        ready = [n for n in chosen if n not in order and upstream[n] <= set(order)]
        if not ready:
            cycle = sorted(n for n in chosen if n not in order)
            raise ConfigurationError(
                f"computations {cycle} form a cycle: a fused query runs each micro-batch in one "
                "pass from producers to consumers, so a cycle cannot run yet"
            )
        order.extend(ready)
    return order


def fusion_order(stages: list[Stage], ctx: PlanContext) -> list[Stage]:
    by_name = {s.name: s for s in stages}
    return [by_name[n] for n in topological_order(ctx.topology, list(by_name))]


def hand_over(stages: list[Stage], ctx: PlanContext) -> list[Stage]:
    here = {s.name for s in stages}
    out = []
    for stage in stages:
        outputs = stage.spec.outputs
        readers = {s: [c for c in ctx.topology.consumers_of(s) if c in here] for s in outputs}
        elsewhere = frozenset(
            s for s in outputs if any(c not in here for c in ctx.topology.consumers_of(s))
        )
        consumers = {s: c for s, c in readers.items() if c}
        out.append(dataclasses.replace(stage, consumers=consumers, elsewhere=elsewhere))
    return out


def targets_of(
    ctx: PlanContext, stream: str, consumed: bool, elsewhere: bool
) -> tuple[Target, ...]:
    """Where a stream goes outside its query: its sink; its topic when something outside may
    read it (dead letters, a computation of another query, a stream nothing consumes, a
    published one). The topic comes first: in-flight records are tracked on target 0."""
    topology = ctx.topology
    kafka = tuple(sorted(ctx.endpoints.kafka.items()))
    targets: list[Target] = []
    sink = topology.sinks.get(stream)
    external_topic = stream == DEAD_LETTERS or stream in topology.published or elsewhere
    if external_topic or (not consumed and sink is None):
        targets.append(Target(InternalStreamSink(topology.topic_of(stream), kafka), 0))
    if sink is not None:
        targets.append(Target(UserSink.bound(sink, dict(ctx.endpoints.kafka)), len(targets)))
    return tuple(targets)


def delivery_targets(stages: list[Stage], ctx: PlanContext) -> list[Stage]:
    return [
        dataclasses.replace(
            stage,
            targets={
                s: targets_of(ctx, s, s in stage.consumers, s in stage.elsewhere)
                for s in stage.spec.outputs
            },
        )
        for stage in stages
    ]


def topic_inputs(stages: list[Stage], ctx: PlanContext) -> list[Stage]:
    here = {s.name for s in stages}
    topology = ctx.topology
    return [
        dataclasses.replace(
            stage,
            topic_inputs=frozenset(
                s
                for s in stage.spec.inputs
                if s not in topology.sources and any(p not in here for p in topology.producer_of(s))
            ),
        )
        for stage in stages
    ]


def event_logs(stages: list[Stage], ctx: PlanContext) -> list[Stage]:
    """Each joiner with a log tier gets the Kafka sources of its secondary stream, with the
    application's broker settings as its injectors get them (`connectors/join_log.py`)."""
    from millstream.connectors.join_log import bind, log_sources
    from millstream.connectors.join_operator import JoinOperator
    from millstream.connectors.query_sources import kafka_options

    out = []
    for stage in stages:
        operator = stage.spec.computation
        if not isinstance(operator, JoinOperator) or operator.log_tier is None:
            out.append(stage)
            continue
        connection = kafka_options(ctx.settings, ctx.endpoints)
        sources = log_sources(ctx.topology, operator.secondary, connection)
        if not sources:
            log.warning(
                "join %s: stream %s has no Kafka source, so no log tier: a query older than "
                "cache_ttl_s is not found", stage.name, operator.secondary,
            )  # fmt: skip
        spec = dataclasses.replace(stage.spec, computation=bind(operator, sources))
        out.append(dataclasses.replace(stage, spec=spec))
    return out


PASSES: tuple[Pass, ...] = (fusion_order, hand_over, delivery_targets, topic_inputs, event_logs)


def bare_stage(spec: ComputationSpec, ctx: PlanContext) -> Stage:
    """A computation before any pass: its shards, shard-store options and metrics key."""
    settings = ctx.settings
    return Stage(
        spec=spec,
        shards=spec.options.shards or settings.shards,
        config=ShardConfig(
            bucket_ms=settings.bucket_seconds * 1000,
            bloom_expected=settings.bloom_expected,
            bloom_fp_rate=settings.bloom_fp_rate,
            use_bloom=spec.options.use_bloom,
        ),
        metrics_key=app_key(ctx.topology.app, "metrics", spec.name),
    )


def plan_stages(
    ctx: PlanContext, names: Sequence[str], passes: Sequence[Pass] = PASSES
) -> dict[str, Stage]:
    """The query's stages, in fusion order, after every pass."""
    stages = [bare_stage(ctx.topology.computations[n], ctx) for n in names]
    for step in passes:
        stages = step(stages, ctx)
    return {s.name: s for s in stages}


def batch_plan(
    ctx: PlanContext,
    stage: Stage,
    batch_id: int,
    marks: tuple[Watermark, Watermark | None, Watermark],
    now: int,
) -> BatchPlan:
    """What every shard task of `stage`'s part of a batch needs. `marks`: its input watermark,
    the input watermark at the batch's end offsets (None when unknown) and its published
    output watermark."""
    input_wm, end_wm, output_wm = marks
    settings = ctx.settings
    internal = frozenset(s for s in stage.spec.inputs if s not in ctx.topology.sources)
    return BatchPlan(
        app=ctx.topology.app,
        batch_id=batch_id,
        redis_url=ctx.endpoints.redis_url,
        shards=stage.shards,
        generation=stage.generation,
        shard_config=stage.config,
        input_watermark=input_wm,
        gc_watermark=input_wm.system - settings.gc_slack_seconds * 1000,
        now=now,
        user_retries=settings.user_retries,
        fail_stop=settings.on_user_error == "fail-stop",
        internal_inputs=internal,
        deliveries=stage.targets,
        in_flight_streams=stage.elsewhere,
        max_record_bytes=settings.max_record_bytes,
        max_future_ms=settings.max_future_ms,
        output_watermark=output_wm.event,
        handed_streams=frozenset(stage.consumers),
        end_watermark=end_wm,
    )
