"""Run a topology: start its fused streaming queries and keep them going.

A small function wires the layers; no god object. Stops cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from millstream.connectors.delivery import release_sinks
from millstream.connectors.fused import FusedRunner
from millstream.connectors.segments import Segment, SegmentLayout, plan_segments
from millstream.connectors.spark_session import spark_session
from millstream.connectors.standby import Heartbeat
from millstream.connectors.targets import DEFAULT_PARTITIONS, Endpoints
from millstream.connectors.topics import check_input_topics, ensure_topics
from millstream.connectors.topology import Topology
from millstream.errors import ConfigurationError, MillstreamError
from millstream.injectors.sources import KAFKA_FORMAT
from millstream.logs import configure_logging
from millstream.settings import DEFAULT_APP, Settings
from millstream.state.client import connect
from millstream.state.shard import PROCESS_CACHE

log = logging.getLogger(__name__)

RESTART_WINDOW_S = 600.0


@contextlib.contextmanager
def endpoints(settings: Settings, *, embedded: bool = False) -> Iterator[Endpoints]:
    """Redis and Kafka from the environment, or, when asked for (`embedded` or
    MILLSTREAM_EMBEDDED=always), embedded services started (and stopped) here.

    An unset one that was not asked for is a ConfigurationError, raised before anything starts.
    """
    from millstream.embedded import embedded_services

    settings.require_endpoints(embedded=embedded)
    with embedded_services(settings) as (redis_url, bootstrap):
        kafka = {**settings.kafka_extra, "bootstrap.servers": bootstrap}
        yield Endpoints(redis_url=redis_url, kafka=kafka)


def ship_user_code(topology: Topology) -> None:
    """Pickle user computations, key extractors and value formats by value when executors
    cannot import them.

    A computation defined in a script or a test module is not importable in Spark's Python
    workers; cloudpickle then sends its code along instead of a module reference.
    """
    from pyspark import cloudpickle

    objects: list[Any] = []
    for spec in topology.computations.values():
        objects.extend(spec.operator.user_objects())
        objects.extend(spec.inputs.values())
    objects.extend(type(fmt) for fmt in topology.formats.values())  # user-defined formats
    for obj in objects:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None or module.__name__ == "__main__":
            continue
        if module.__name__.split(".")[0] == "millstream":
            continue
        origin = getattr(module, "__file__", "") or ""
        if "site-packages" in origin or "dist-packages" in origin:
            continue
        cloudpickle.register_pickle_by_value(module)


class Application:
    """The running fused queries of one topology (connectors/fused.py, connectors/segments.py)."""

    def __init__(self, topology: Topology, settings: Settings, ends: Endpoints, spark: Any):
        topology.validate()
        ship_user_code(topology)
        self.topology = topology
        self.settings = settings
        self.endpoints = ends
        self.spark = spark
        self.runners: dict[str, FusedRunner] = {}  # query (segment) name -> its runner
        self.restarts: dict[str, list[float]] = {}
        self.layout = SegmentLayout(connect(ends.redis_url), topology.app)
        self._prepared: list[FusedRunner] = []

    def running(self) -> dict[str, str]:
        """Computation -> the query that runs it."""
        return {name: seg for seg, runner in self.runners.items() for name in runner.order}

    def _build(self, names: list[str] | None) -> list[FusedRunner]:
        """Runners for the wanted computations that do not run yet (their checks done: the
        recorded shard count, cycles), and the topics they write created."""
        wanted = names or list(self.topology.computations)
        unknown = sorted(set(wanted) - set(self.topology.computations))
        if unknown:
            raise ConfigurationError(f"no computation named {unknown} in the topology")
        segments = plan_segments(self.layout.load(), wanted, self.running())
        runners = [
            FusedRunner(
                self.topology,
                self.settings,
                self.endpoints,
                list(seg.computations),
                segment=seg.name,
                reads=seg.reads,
            )
            for seg in segments
        ]
        self._ensure_topics(runners)
        return runners

    def _ensure_topics(self, runners: list[FusedRunner]) -> None:
        topics = {
            topic: self.topology.partitions.get(stream, DEFAULT_PARTITIONS)
            for runner in runners
            for stream in self.topology.internal_streams()
            if (topic := self.topology.topic_of(stream)) in runner.topics()
        }
        if topics:
            ensure_topics(self.endpoints.kafka, topics)
        check_input_topics(
            self.endpoints.kafka,
            (
                (stream, topic.strip())
                for runner in runners
                for stream in runner.injected_inputs()
                for src in self.topology.sources[stream]
                if src.format == KAFKA_FORMAT
                for topic in src.options.get("topics", "").split(",")
                if topic.strip()
            ),
        )

    def prepare(self) -> None:
        """Build the queries `start()` starts and create the topics they write: an unreachable
        broker or a configuration error fails here, before the JVM starts."""
        self._prepared = self._build(None)

    def start(self, names: list[str] | None = None) -> None:
        """Start computations (all by default); others already running keep running.

        The first start forms the queries recorded for this application (one, MAIN, on its
        first run). Computations added to a running application run in a new query, started
        from their own positions (`start=`); a running query that produces a stream they read
        is restarted from its checkpoint to write that stream to its topic as well.
        """
        prepared, self._prepared = self._prepared, []
        runners = prepared if prepared and names is None else self._build(names)
        if not runners:
            return
        new = {s for r in runners for s in r.topic_inputs()}
        for seg, running in list(self.runners.items()):
            produced = {s for st in running.stages.values() for s in st.spec.outputs}
            written = {s for st in running.stages.values() for s in st.elsewhere}
            if (produced & new) - written:
                self._restart(seg, running.order, running.extra_reads)
        for runner in runners:
            self.layout.save(Segment(runner.segment, tuple(runner.order), tuple(runner.reads())))
            runner.start(self.spark)
            self.runners[runner.segment] = runner
            log.info("started query %s: %s", runner.segment, " -> ".join(runner.order))

    def _restart(self, segment: str, names: list[str], reads: frozenset[str]) -> None:
        """Rebuild a running query with the topology as it is now, from its checkpoint."""
        old = self.runners[segment]
        runner = FusedRunner(
            self.topology, self.settings, self.endpoints, names, segment=segment,
            reads=sorted(reads | set(old.reads())),
        )  # fmt: skip
        self._ensure_topics([runner])
        with contextlib.suppress(Exception):
            old.query.stop()
        old.close()
        self.layout.save(Segment(segment, tuple(runner.order), tuple(runner.reads())))
        runner.start(self.spark)
        self.runners[segment] = runner
        log.info("restarted query %s: %s", segment, " -> ".join(runner.order))

    def remove(self, name: str) -> None:
        """Stop running a computation; the others keep running and keep their progress.

        Its state, timers and checkpoints stay in Redis: started again (`start([name])`), it
        goes on from them. A computation that another running one reads from cannot go first.
        """
        running = self.running()
        if name not in running:
            raise ConfigurationError(f"computation {name!r} is not running")
        readers = sorted(
            c
            for s in self.topology.computations[name].outputs
            for c in self.topology.consumers_of(s)
            if c in running and c != name
        )
        if readers:
            raise ConfigurationError(
                f"cannot remove computation {name!r}: {readers} read its output; remove them first"
            )
        segment = running[name]
        old = self.runners[segment]
        rest = [n for n in old.order if n != name]
        if not rest:
            with contextlib.suppress(Exception):
                old.query.stop()
            old.close()
            del self.runners[segment]
            self.layout.drop(segment)
            log.info("stopped query %s (computation %s removed)", segment, name)
            return
        # The query keeps reading what the removed computation read: its checkpoint pins them.
        self._restart(segment, rest, frozenset(old.reads()))
        log.info("removed computation %s from query %s", name, segment)

    def check(self) -> None:
        """Restart a failed query from its checkpoint, or raise once restarts are used up.

        A query fails when one task does (Spark's local mode retries no task): a killed Python
        worker, a Redis or broker restart mid-commit. Restarting replays the failed batch from
        the checkpoint, and dedup plus leases keep that exactly-once. A failure that repeats more
        than `query_restarts` times within RESTART_WINDOW_S is not transient: it is raised.
        """
        for name, runner in self.runners.items():
            error = runner.query.exception() if runner.query is not None else None
            if error is None:
                continue
            now = time.monotonic()
            recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
            if len(recent) >= self.settings.query_restarts:
                raise RuntimeError(
                    f"query {name!r} ({', '.join(runner.order)}) failed {len(recent) + 1} times "
                    f"within {RESTART_WINDOW_S:.0f}s: {error}"
                ) from None
            log.warning(
                "query %s failed (restart %d of %d): %s",
                name,
                len(recent) + 1,
                self.settings.query_restarts,
                str(error).splitlines()[0][:500],
            )
            self.restarts[name] = [*recent, now]
            with contextlib.suppress(Exception):
                runner.query.stop()
            runner.start(self.spark)

    def stop(self) -> None:
        """Stop the queries, then release what the application built in this process: its
        delivery threads, its sinks' clients and producers, its shards' soft state."""
        for runner in self.runners.values():
            with contextlib.suppress(Exception):
                runner.query.stop()
            runner.close()  # its last batch's deliveries first, then its threads
        release_sinks(self.topology.app)
        PROCESS_CACHE.drop_app(self.topology.app)


def _named_by(settings: Settings, topology: Topology) -> Settings:
    """The settings with the application the topology names: `Topology(app)` decides what a
    run's Redis keys and topics are called, MILLSTREAM_APP only what the CLI's tools (status,
    state, reset, dead-letters) look at by default. A different MILLSTREAM_APP is a warning:
    those tools would then look at an application this run never writes."""
    if settings.app == topology.app:
        return settings
    if settings.app != DEFAULT_APP:
        log.warning(
            "MILLSTREAM_APP=%s is not this run's application: the topology names it %r "
            "(Topology(%r)), and its Redis keys and topics use that name. Set MILLSTREAM_APP=%s "
            "for the CLI's tools, or rename the topology.",
            settings.app,
            topology.app,
            topology.app,
            topology.app,
        )
    return dataclasses.replace(settings, app=topology.app)


def run(
    topology: Topology,
    settings: Settings | None = None,
    *,
    until: Callable[[Application], bool] | None = None,
    on_tick: Callable[[Application], None] | None = None,
    tick_seconds: float = 1.0,
    embedded: bool = False,
) -> None:
    """Run `topology` until interrupted (Ctrl-C, SIGTERM) or until `until(app)` is true.

    REDIS_URL and KAFKA_BOOTSTRAP_SERVERS must be set unless `embedded` (or
    MILLSTREAM_EMBEDDED=always) asks for throw-away embedded services; that is checked before
    anything starts. MILLSTREAM_METRICS_PORT serves Prometheus metrics while it runs.
    """
    from millstream.metrics import serve_metrics

    settings = settings or Settings.from_env()
    configure_logging(settings.log_level)
    settings = _named_by(settings, topology)
    stop = threading.Event()

    def _signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping after the current batches", signum)
        stop.set()

    previous = {s: signal.signal(s, _signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.ExitStack() as stack:
            ends = stack.enter_context(endpoints(settings, embedded=embedded))
            # Once the endpoints are settled: a missing one is a one-line error, nothing else.
            log.info("settings: %s", settings.summary())
            app = Application(topology, settings, ends, spark=None)
            stack.enter_context(
                serve_metrics(settings, ends.redis_url, topology.app, lambda: app.spark)
            )
            heartbeat = Heartbeat(ends.redis_url, topology.app, stop)

            def warm_spark() -> None:  # a standby starts Spark while it waits: a quick takeover
                app.spark = spark_session(settings, f"millstream.{topology.app}")

            if not heartbeat.wait_for_turn(warm_spark):
                return  # stopped while a standby
            stack.callback(heartbeat.close)
            heartbeat.start()
            # Topics first: an unreachable broker fails here, before the JVM starts.
            app.prepare()
            if heartbeat.warming is not None:
                heartbeat.warming.join()
            if app.spark is None:
                warm_spark()
            app.start()
            try:
                while not stop.is_set():
                    app.check()
                    if on_tick is not None:
                        on_tick(app)
                    if until is not None and until(app):
                        break
                    stop.wait(tick_seconds)
            finally:
                app.stop()
            if heartbeat.lost is not None:
                raise MillstreamError(
                    f"another copy took over application {topology.app!r} "
                    f"({heartbeat.lost.describe()}); this one stopped"
                )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
