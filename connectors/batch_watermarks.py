"""Low watermarks within a batch (docs/design.md section 8): each computation's input watermark,
its end-of-batch estimate, and what topic inputs consumed.

A computation's input watermark is the minimum over its inputs: an injected stream's
estimate less its out-of-order bound; a producer's watermark as published earlier in this
batch (its handed productions still count there until the consumer commits them); for a
stream another query produces, also its records delivered to the topic and not yet read here
(in flight). The caller publishes it monotonically (`<computation>#input`); the batch judges
lateness on the value computed now (a re-run batch whose first attempt published its end
watermark must not find its own records late).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from millstream.connectors.segments import SegmentLayout
from millstream.connectors.shard_task import ShardResult
from millstream.connectors.stage_plan import Stage
from millstream.connectors.targets import TOPIC_TIMEOUT_S, Endpoints
from millstream.connectors.topology import Topology
from millstream.kafka_admin import end_offsets
from millstream.state.client import RedisClient
from millstream.state.keys import app_key
from millstream.state.shard import oldest_work
from millstream.state.watermarks import (
    NONE_KNOWN,
    Watermark,
    WatermarkAuthority,
    merge_min,
)


class BatchWatermarks:
    """The watermark side of one fused query's batches."""

    def __init__(
        self,
        topology: Topology,
        client: RedisClient,
        stages: Mapping[str, Stage],
        instance_of: Mapping[str, Sequence[str]],
    ) -> None:
        self.topology = topology
        self.client = client
        self.authority = WatermarkAuthority(client, topology.app)
        self.stages = stages  # in fusion order
        self.instance_of = instance_of  # injected stream -> its injector instances here
        self.partitions: dict[str, int] = {}  # topic input -> its topic's partition count

    # --- injected streams --------------------------------------------------------------------
    def injected(self) -> dict[str, Watermark]:
        """Each injected stream's estimate (min over its sources), less its out-of-order bound."""
        return {
            stream: self.less_bound(
                stream, self.authority.injector_watermark(stream, list(instances))
            )
            for stream, instances in self.instance_of.items()
        }

    def less_bound(self, stream: str, estimate: Watermark) -> Watermark:
        """An injector estimate less its stream's out-of-order bound (`max_out_of_order_ms`)."""
        bound = self.topology.out_of_order_ms.get(stream, 0)
        if estimate.event > NONE_KNOWN.event:
            return Watermark(estimate.event - bound, estimate.system)
        return estimate

    def end_estimates(
        self,
        entry: list[dict] | None,
        sources: Sequence[tuple[str, dict[str, str]]],
        injected: dict[str, Watermark],
    ) -> dict[str, Watermark] | None:
        """Each injected stream's watermark once this batch's records are applied: the
        estimates the injectors stored with the batch's end offsets in Spark's offset log
        (`entry`: what their commit publishes later), less the out-of-order bound. None when
        the log cannot be read here (a checkpoint not on the local file system)."""
        if entry is None or len(entry) != len(sources):
            return None
        ends: dict[str, Watermark] = {}
        for (_fmt, options), offset in zip(sources, entry, strict=True):
            if "instance" not in options:
                continue  # a topic another query writes: its producers bound it, not an estimate
            try:
                event, system = (int(v) for v in offset["wm"])
            except (KeyError, TypeError, ValueError):
                return None
            stream = options["stream"]
            estimate = Watermark(event, system)
            ends[stream] = estimate if stream not in ends else ends[stream].min(estimate)
        out = dict(injected)
        for stream, estimate in ends.items():
            out[stream] = self.less_bound(stream, estimate).max(injected.get(stream, NONE_KNOWN))
        return out

    # --- per computation ---------------------------------------------------------------------
    def input(
        self, stage: Stage, injected: dict[str, Watermark], published: dict[str, Watermark]
    ) -> Watermark:
        """min over input streams (see the module docstring)."""
        parts: list[Watermark] = []
        for stream in stage.spec.inputs:
            if stream in self.topology.sources:
                parts.append(injected.get(stream, NONE_KNOWN))
                continue
            for producer in self.topology.producer_of(stream):
                value = published.get(producer) or self.authority.published(producer)
                parts.append(value or NONE_KNOWN)
            if stream in stage.topic_inputs:
                consumed = self.consumed(stage.name, stream)
                partitions = self.partitions[stream]
                parts.append(self.authority.in_flight(stream, partitions, consumed))
                if not self.caught_up(stage, stream, consumed):
                    parts.append(NONE_KNOWN)
        return merge_min(parts)

    def end(self, stage: Stage, at_end: dict[str, Watermark] | None) -> Watermark | None:
        """The input watermark of a computation that reads injected streams only, once it
        applied the batch's records (it read them up to the end offsets); None otherwise."""
        if at_end is None or any(s not in self.topology.sources for s in stage.spec.inputs):
            return None
        return merge_min([at_end.get(s, NONE_KNOWN) for s in stage.spec.inputs])

    def republish(self, at_end: dict[str, Watermark]) -> None:
        """After the acknowledgements, each computation's low watermark again, in topological
        order: the productions just acknowledged no longer hold it, and its injected inputs
        count at the batch's end estimates. Without this, a window count emitted in this batch
        would hold its producer's watermark at the window's end until the next batch."""
        published: dict[str, Watermark] = {}
        for name, stage in self.stages.items():
            input_wm = self.input(stage, at_end, published)
            self.authority.publish(f"{name}#input", input_wm)
            oldest = oldest_work(self.client, stage.keys(self.topology.app))
            published[name] = self.authority.publish(name, merge_min([input_wm, *oldest]))

    # --- topic inputs ------------------------------------------------------------------------
    def consumed(self, computation: str, stream: str) -> dict[int, int]:
        raw = self.client.hgetall(app_key(self.topology.app, "consumed", computation, stream))
        return {int(k): int(v) for k, v in raw.items()}

    def record_consumed(self, stage: Stage, results: list[ShardResult]) -> None:
        """Topic inputs: the offsets read past, per partition, so the producers' in-flight
        records below them stop holding this computation's watermark."""
        consumed: dict[str, dict[int, int]] = {}
        for result in results:
            for stream, parts in result.consumed.items():
                if stream not in stage.topic_inputs:
                    continue
                merged = consumed.setdefault(stream, {})
                for partition, offset in parts.items():
                    merged[partition] = max(merged.get(partition, 0), offset)
        for stream, parts in consumed.items():
            key = app_key(self.topology.app, "consumed", stage.name, stream)
            known = self.consumed(stage.name, stream)
            self.client.hset(key, mapping={p: max(o, known.get(p, 0)) for p, o in parts.items()})
            self._retire_in_flight(stream)

    def _retire_in_flight(self, stream: str) -> None:
        """Drop in-flight entries every consumer of the stream read past (docs/design.md
        section 8): pure garbage collection, since `in_flight` reads entries at or beyond a
        consumer's offsets only. A partition some consumer has not read yet keeps all its
        entries."""
        layout = SegmentLayout(self.client, self.topology.app).load()
        producers = set(self.topology.producer_of(stream))
        # Consumers in a producer's own query take the stream by hand-over, not from its topic.
        inside = {
            c
            for seg in layout.values()
            if producers & set(seg.computations)
            for c in seg.computations
        }
        floor: dict[int, int] | None = None
        for consumer in self.topology.consumers_of(stream):
            if consumer in inside and consumer not in self.stages:
                continue
            offsets = self.consumed(consumer, stream)
            floor = (
                offsets
                if floor is None
                else {p: min(o, offsets[p]) for p, o in floor.items() if p in offsets}
            )
        if floor:
            self.authority.retire_in_flight(stream, floor)

    def mark_catch_up(self, endpoints: Endpoints) -> None:
        """A computation starting from the earliest record of a topic another query writes
        reads records delivered before anything tracked them in flight: until it has read up
        to the topic's end as of now, nothing bounds their times, so its input watermark from
        that stream stays unknown (no timer fires on it, no record of that history is late)."""
        for stage in self.stages.values():
            for stream in stage.topic_inputs:
                if stage.spec.options.start != "earliest":
                    continue
                if self.consumed(stage.name, stream):
                    continue  # it has read from the topic before: in-flight tracking holds it
                key = app_key(self.topology.app, "catchup", stage.name, stream)
                if self.client.exists(key):
                    continue
                ends = end_offsets(
                    endpoints.kafka,
                    self.topology.topic_of(stream),
                    self.partitions[stream],
                    TOPIC_TIMEOUT_S,
                )
                if any(ends.values()):
                    self.client.hset(key, mapping={p: o for p, o in ends.items() if o})

    def caught_up(self, stage: Stage, stream: str, consumed: dict[int, int]) -> bool:
        key = app_key(self.topology.app, "catchup", stage.name, stream)
        raw = self.client.hgetall(key)
        if not raw:
            return True
        if all(consumed.get(int(p), 0) >= int(o) for p, o in raw.items()):
            self.client.delete(key)
            return True
        return False
