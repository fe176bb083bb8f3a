"""One Structured Streaming query per application: every computation runs in each micro-batch.

Cloud Dataflow's fusion with MillWheel's strong productions, the micro-batch as the delivery
channel (docs/design.md section 3). `FusedRunner` runs the batch protocol; each concern is a module:

1. *read* (`driver_read`): the batch's injected rows come to the driver once: read there,
   from the ranges in Spark's offset log, or from Spark as Arrow;
2. for each computation in fusion order (`stage_plan`: the plan as data, built by passes):
   - *input watermark* (`batch_watermarks`): injectors' estimates, and the watermarks its
     producers published earlier in this batch (which still count the productions handed to
     it as their oldest work: in flight until it commits);
   - *route* (`routing`): each row's key by this computation's extractor, its shard by the
     key, computed once; productions handed over by producers run through the same extractors;
   - *run shards* (`shard_jobs`): one Spark job, busy shards only, several shards per task
     (`shard_task.run_shard`: acquire, dedup, the operator's steps, commit);
   - *publish* its low watermark, and *hand over* its productions to its consumers
     (`settlement`);
3. *settle* (`settlement`): deliver productions bound outside the application and acknowledge
   every shard's checkpoints under the lease they were committed with, once every consumer
   committed them and every external target took them; a shard whose productions no
   computation here consumes is settled as soon as it committed, in a thread;
4. *metrics* (`batch_metrics`). Before a batch, *backpressure* (`backpressure`) holds new input
   while a target is backlogged.

A crash anywhere re-runs the batch: producers find their checkpoints still pending and hand
them over again, consumers drop what they already applied (same production id, same position:
a replay). A stream consumed only inside the application never touches Kafka.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any

from millstream.connectors import driver_read, memory
from millstream.connectors.backpressure import hold_while_backlogged
from millstream.connectors.batch_metrics import record_batch, stage_metrics
from millstream.connectors.batch_watermarks import BatchWatermarks
from millstream.connectors.delivery import warm_sinks
from millstream.connectors.out_of_memory import run_while_redis_full
from millstream.connectors.plan import BatchPlan
from millstream.connectors.query_sources import source_options
from millstream.connectors.replay_intake import ReplayIntake, replay_rows
from millstream.connectors.rescaling import apply_rescales, take_layouts
from millstream.connectors.routing import route_stage
from millstream.connectors.segments import MAIN
from millstream.connectors.settlement import Done, Settlement, hand_over
from millstream.connectors.shard_jobs import WarmWorkers, busy_shards, no_cyclic_gc, run_shards
from millstream.connectors.stage_plan import (
    PlanContext,
    Stage,
    batch_plan,
    plan_stages,
    topological_order,
)
from millstream.connectors.targets import TOPIC_TIMEOUT_S, Endpoints, InternalStreamSink
from millstream.connectors.throttle import Throttles
from millstream.connectors.topology import Topology
from millstream.errors import ConfigurationError
from millstream.fault_points import fault_point
from millstream.kafka_admin import check_topics
from millstream.settings import Settings
from millstream.state.client import connect
from millstream.state.keys import app_key
from millstream.state.shard import oldest_work
from millstream.state.watermarks import (
    NONE_KNOWN,
    Watermark,
    WatermarkAuthority,
    merge_min,
    now_ms,
)

log = logging.getLogger(__name__)


class FusedRunner:
    """One fused streaming query over some of an application's computations: the batch
    protocol above.

    An application starts with one (`MAIN`) running all its computations. A computation added
    to a running application runs in a query of its own (`segment`, named after it), so the
    others keep their progress: it reads its injected streams with its own positions, and the
    streams it shares with the other queries through their Kafka topics.
    """

    def __init__(
        self,
        topology: Topology,
        settings: Settings,
        endpoints: Endpoints,
        names: Sequence[str] | None = None,
        segment: str = MAIN,
        reads: Sequence[str] = (),
    ) -> None:
        self.topology = topology
        self.settings = settings
        self.endpoints = endpoints
        self.segment = segment
        self.extra_reads = frozenset(reads)  # read although no computation here reads them
        self.order = topological_order(topology, names or list(topology.computations))
        self.client = connect(endpoints.redis_url)
        self.authority = WatermarkAuthority(self.client, topology.app)
        self.context = PlanContext(topology, settings, endpoints)
        self.stages: dict[str, Stage] = plan_stages(self.context, self.order)
        take_layouts(self.client, topology.app, self.stages)
        self.watermarks = BatchWatermarks(
            topology,
            self.client,
            self.stages,
            {
                stream: [self._instance(s.name) for s in sources]
                for stream, sources in topology.sources.items()
            },
        )
        self.sources: list[tuple[str, dict[str, str]]] = []  # read by the query, in order
        self.offset_log = driver_read.OffsetLog(self.checkpoint)
        self.settlement = Settlement(self.client, topology.app)
        self.warm = WarmWorkers()  # Spark's Python workers, from the query's start
        self.replays = ReplayIntake(
            self.client, topology.app, tuple(self.order), settings.max_records_per_batch
        )
        self.throttles = Throttles(self.client, topology.app, self.stages.values())
        self.query: Any = None
        self.last_batch: dict[str, Any] = {}

    # --- wiring ------------------------------------------------------------------------------
    def topics(self) -> list[str]:
        """The Kafka topics this query writes (and so creates at start)."""
        return sorted(
            {
                target.factory.topic
                for stage in self.stages.values()
                for targets in stage.targets.values()
                for target in targets
                if isinstance(target.factory, InternalStreamSink)
            }
        )

    def topic_inputs(self) -> list[str]:
        """Streams this query reads from topics other queries write."""
        needed = {s for stage in self.stages.values() for s in stage.topic_inputs}
        kept = {s for s in self.extra_reads if s not in self.topology.sources}
        return sorted(needed | kept)

    def injected_inputs(self) -> list[str]:
        """Injected streams this query reads."""
        needed = {s for n in self.order for s in self.topology.computations[n].inputs}
        return sorted((needed | self.extra_reads) & set(self.topology.sources))

    def reads(self) -> list[str]:
        """Every stream this query reads: a Spark checkpoint pins them."""
        return sorted({*self.injected_inputs(), *self.topic_inputs()})

    def streams(self) -> set[str]:
        """Every stream this query's computations read or write (to tell which queries share
        a stream)."""
        return {
            s for stage in self.stages.values() for s in (*stage.spec.inputs, *stage.spec.outputs)
        }

    def _instance(self, source_name: str) -> str:
        """An injector instance per query: each reads from its own positions."""
        suffix = "" if self.segment == MAIN else f"/{self.segment}"
        return f"{source_name}@{self.topology.app}{suffix}"

    def input_frame(self, spark: Any) -> Any:
        """Every injected stream the query's computations read, each source read once, and
        the topics of streams that other queries produce."""
        streams = self.injected_inputs()
        topic_inputs = self.topic_inputs()
        if not streams and not topic_inputs:
            raise ConfigurationError(
                f"computations {self.order} read no injected stream: declare one with .source()"
            )
        sources = source_options(
            self.topology, self.settings, self.endpoints, self.stages, streams, topic_inputs,
            self._instance, self.checkpoint,
        )  # fmt: skip
        self.sources = sources
        frames = [spark.readStream.format(fmt).options(**opts).load() for fmt, opts in sources]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    @property
    def checkpoint(self) -> str:
        suffix = "" if self.segment == MAIN else f"-{self.segment}"
        return f"{self.settings.checkpoint_dir}/{self.topology.app}/fused{suffix}"

    def close(self) -> None:
        """Release the delivery threads of a runner that will not run again (replaced or
        removed at run time), once its last batch's end is over; its query is stopped by then."""
        self.settlement.shutdown()
        self.warm.stop()

    def read_partitions(self) -> None:
        """Each topic input's partition count, from the broker's metadata: a topic created
        beforehand may have more than the default, and records in flight in partitions the
        watermark did not look at would not hold it. Read at start: a running query's topics
        keep their partitions (adding some would move keys between them)."""
        topics = {s: self.topology.topic_of(s) for s in self.topic_inputs()}
        if topics:
            counts = check_topics(self.endpoints.kafka, sorted(topics.values()), TOPIC_TIMEOUT_S)
            self.watermarks.partitions = {s: counts[t] for s, t in topics.items()}

    def start(self, spark: Any) -> Any:
        """Start the query. The topics it reads must exist (their partition counts are read
        from the broker: in-flight records in every partition hold the consumers' watermarks)."""
        self.read_partitions()
        # While the query starts: the settlement delivers from this process.
        self.settlement.pool.submit(warm_sinks, self.topology.app, list(self.stages.values()))
        self.warm.start(spark)
        self.watermarks.mark_catch_up(self.endpoints)
        self.offset_log.forget()  # a new query: its offset log is read afresh
        suffix = "" if self.segment == MAIN else f".{self.segment}"
        self.query = (
            self.input_frame(spark)
            .writeStream.queryName(f"{self.topology.app}.fused{suffix}")
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime=f"{self.settings.trigger_ms} milliseconds")
            .start()
        )
        return self.query

    # --- the per-batch protocol --------------------------------------------------------------
    def process_batch(self, batch_df: Any, batch_id: int) -> None:
        """Run one micro-batch; while Redis is at maxmemory, run it again
        (`connectors/out_of_memory.py`). Any other failure fails the query (Application.check
        restarts it)."""

        def run() -> None:
            with no_cyclic_gc():
                self._run_batch(batch_df, batch_id)

        run_while_redis_full(
            run,
            self.topology.app,
            self.endpoints.redis_url,
            batch_id,
            lambda: self.query is None or self.query.isActive,
        )
        memory.trim()  # the batch's rows and payloads are freed: give their pages back

    def _hold_while_backlogged(self, batch_id: int) -> None:
        """Backpressure (`connectors/backpressure.py`), before the batch takes its input."""
        hold_while_backlogged(
            list(self.stages.values()),
            self.topology.app,
            self.client,
            self.settings.max_pending_productions,
            lambda stage: self._plan(stage, batch_id, NONE_KNOWN, now_ms()),
            self.settlement.pool,
            lambda: self.query is None or self.query.isActive,
            batch_id,
        )

    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        """docs/design.md section 3 as one pass: read; per computation in topological order its
        input watermark, route, run its busy shards (acquire, dedup, fire timers, run records,
        commit: `shard_task.run_shard`), publish and hand over; then deliver and acknowledge
        (started at once for productions no computation here consumes)."""
        self.settlement.wait_behind()  # the previous batch's end, when it ran behind
        self._hold_while_backlogged(batch_id)
        started = time.perf_counter()
        apply_rescales(self.client, self.topology.app, self.stages)  # between two batches
        ranges = (
            self.offset_log.ranges(batch_id, self.sources) if self.settings.driver_read else None
        )
        by_stream, rows = driver_read.read_batch(batch_df, ranges, self.sources)
        replayed = self.replays.take()
        phases: dict[str, float] = {"read": round(time.perf_counter() - started, 4)}
        now = now_ms()
        injected = self.watermarks.injected()
        at_end = self.watermarks.end_estimates(
            self.offset_log.entry(batch_id), self.sources, injected
        )
        published: dict[str, Watermark] = {}
        handed: dict[str, list[tuple]] = {}
        done: list[Done] = []
        settling: list[tuple[Done, Future[dict[str, int]]]] = []
        try:
            for name in self.order:
                stage = self.stages[name]
                handing = self._run_stage(
                    batch_df.sparkSession, batch_id, stage, now, (injected, at_end, published),
                    (by_stream, handed, replayed.get(name, [])), phases,
                )  # fmt: skip
                for item in handing:
                    if any(p.stream in stage.consumers for p in item.result.outstanding):
                        done.append(item)  # acknowledged once its consumers committed
                    else:
                        # Nothing here consumes them: delivered while the next computations run.
                        settling.append((item, self.settlement.start(item)))
        except BaseException:
            # No settlement goes on behind a failed batch (its re-run settles them again).
            futures_wait([future for _, future in settling])
            raise
        if done:
            # Consumers committed; nothing they consumed is acknowledged yet.
            fault_point("fused_after_consumers_commit")
        end = functools.partial(
            self._end_batch, batch_id, rows, phases, started, at_end, done, settling
        )
        if self.settings.overlap_delivery:
            self.settlement.run_behind(end)  # while Spark commits this batch and plans the next
        else:
            end()
        # After the commits, before Spark plans the next batch: a join's clicks pause there.
        self.throttles.check(now_ms())

    def _end_batch(
        self,
        batch_id: int,
        rows: int,
        phases: dict[str, float],
        started: float,
        at_end: dict[str, Watermark] | None,
        done: list[Done],
        settling: list[tuple[Done, Future[dict[str, int]]]],
    ) -> None:
        """Settle the batch (deliver outside, acknowledge), republish the watermarks that
        counted its productions as in flight, record its metrics."""
        delivery_started = time.perf_counter()
        delivery = self.settlement.finish(done, settling)
        if (done or settling) and at_end is not None:
            self.watermarks.republish(at_end)
        phases["deliver_ack"] = round(time.perf_counter() - delivery_started, 4)
        self.replays.settled()
        self.last_batch = {"batch_id": batch_id, "rows": rows, "phases": phases}
        query_key = app_key(
            self.topology.app, "fused" if self.segment == MAIN else f"fused-{self.segment}"
        )
        record_batch(
            self.client,
            self.stages,
            delivery,
            query_key,
            self.last_batch,
            time.perf_counter() - started,
        )

    def _run_stage(
        self,
        spark: Any,
        batch_id: int,
        stage: Stage,
        now: int,
        marks: tuple[dict[str, Watermark], dict[str, Watermark] | None, dict[str, Watermark]],
        rows: tuple[dict[str, list[tuple]], dict[str, list[tuple]], list[tuple[str, Any]]],
        phases: dict[str, float],
    ) -> list[Done]:
        """One computation's part of the batch: input watermark, route, run its busy shards,
        publish its low watermark, hand its productions over to its consumers (`rows[1]`).
        `rows[2]`: the dead letters replayed to it (`connectors/replay_intake.py`).
        `marks`: the injected estimates, those at the batch's end and what earlier
        computations published in this batch (added to here)."""
        started = time.perf_counter()
        name = stage.name
        injected, at_end, published = marks
        by_stream, handed, replayed = rows
        input_wm = self.watermarks.input(stage, injected, published)
        end_wm = self.watermarks.end(stage, at_end)
        # Published before the tasks run: a firing seen committed is never ahead of it.
        self.authority.publish(f"{name}#input", end_wm or input_wm)
        plan = self._plan(stage, batch_id, input_wm, now, end_wm)
        route_started = time.perf_counter()
        extra = replay_rows(replayed, now, (end_wm or input_wm).event, stage.spec.inputs, name)
        inputs = route_stage(stage, by_stream, handed, extra)
        routed = time.perf_counter()
        event_wm = (end_wm or input_wm).event
        busy = busy_shards(self.client, self.topology.app, stage, inputs, event_wm, now)
        results = run_shards(spark, plan, stage, inputs, busy, self.settings.small_batch_rows)
        phases[f"{name}:route"] = round(routed - route_started, 4)
        phases[f"{name}:shards"] = round(time.perf_counter() - routed, 4)
        self.watermarks.record_consumed(stage, results)
        oldest = oldest_work(self.client, stage.keys(self.topology.app))
        published[name] = self.authority.publish(name, merge_min([end_wm or input_wm, *oldest]))
        handing = hand_over(stage, plan, results, handed)
        if handing:
            # This computation committed, the ones after it have not run yet.
            fault_point(f"fused_after_stage_{name}")
        stage.last_batch = stage_metrics(batch_id, input_wm, published[name], oldest, results, busy)
        phases[name] = round(time.perf_counter() - started, 4)
        return handing

    def _plan(
        self,
        stage: Stage,
        batch_id: int,
        input_wm: Watermark,
        now: int,
        end_wm: Watermark | None = None,
    ) -> BatchPlan:
        """What every shard task of this computation's part of the batch needs."""
        output_wm = self.authority.published(stage.name) or NONE_KNOWN
        return batch_plan(self.context, stage, batch_id, (input_wm, end_wm, output_wm), now)
