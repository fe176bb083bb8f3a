"""Run a topology: start one streaming query per computation and keep them going.

A small function wires the layers; no god object. Stops cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from millstream.connectors.driver import DEFAULT_PARTITIONS, ComputationRunner, Endpoints
from millstream.connectors.topics import ensure_topics
from millstream.connectors.topology import Topology
from millstream.errors import ConfigurationError
from millstream.settings import Settings

log = logging.getLogger(__name__)

RESTART_WINDOW_S = 600.0


def spark_session(settings: Settings, app_name: str) -> Any:
    """A SparkSession whose Python workers run this interpreter (so they see our packages)."""
    from millstream.embedded import check_java

    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.scheduler.mode", "FAIR")  # concurrent queries interleave their jobs
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.driver.memory", "1g")
        # A Python worker on a saturated machine may take longer than the default 15 s to
        # connect back to the JVM; that failed whole queries under load. Wait longer.
        .config("spark.python.authenticate.socketTimeout", "60s")
        # Options such as redis.url may carry a password: keep them out of Spark's logs and UI.
        .config("spark.redaction.regex", r"(?i)secret|password|token|access[.]?key|url")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from millstream.injectors import register

    register(spark)
    return spark


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
        objects.append(type(spec.computation))
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
    """The running queries of one topology."""

    def __init__(self, topology: Topology, settings: Settings, ends: Endpoints, spark: Any):
        topology.validate()
        ship_user_code(topology)
        self.topology = topology
        self.settings = settings
        self.endpoints = ends
        self.spark = spark
        self.runners: dict[str, ComputationRunner] = {}
        self.restarts: dict[str, list[float]] = {}

    def prepare(self) -> None:
        streams = self.topology.internal_streams()
        if self.settings.runtime == "fused":  # only the topics something outside reads
            from millstream.connectors.fused import FusedRunner

            written = set(FusedRunner(self.topology, self.settings, self.endpoints).topics())
            streams = [s for s in streams if self.topology.topic_of(s) in written]
        topics = {
            self.topology.topic_of(s): self.topology.partitions.get(s, DEFAULT_PARTITIONS)
            for s in streams
        }
        ensure_topics(self.endpoints.kafka, topics)

    def start(self, names: list[str] | None = None) -> None:
        """Start computations (all by default); others already running are left untouched.

        Every runner is built (its checks done: the recorded shard count) before any query
        starts, so a configuration error starts nothing. With MILLSTREAM_RUNTIME=fused one query
        runs every computation (connectors/fused.py).
        """
        if self.settings.runtime == "fused":
            self._start_fused(names)
            return
        runners = {
            name: ComputationRunner(
                self.topology, self.topology.computations[name], self.settings, self.endpoints
            )
            for name in names or list(self.topology.computations)
            if name not in self.runners
        }
        for name, runner in runners.items():
            runner.start(self.spark)
            self.runners[name] = runner
            log.info("started computation %s", name)

    def _start_fused(self, names: list[str] | None) -> None:
        from millstream.connectors.fused import FUSED, FusedRunner

        wanted = names or list(self.topology.computations)
        running = self.runners.get(FUSED)
        if running is not None:
            missing = sorted(set(wanted) - set(running.order))
            if missing:
                raise ConfigurationError(
                    f"cannot add {missing} to the running fused query: restart the application "
                    f"with them (adding computations at run time needs MILLSTREAM_RUNTIME=queries)"
                )
            return
        runner = FusedRunner(self.topology, self.settings, self.endpoints, wanted)
        runner.start(self.spark)
        self.runners[FUSED] = runner  # type: ignore[assignment]
        log.info("started the fused query: %s", " -> ".join(runner.order))

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
                    f"computation {name!r} failed {len(recent) + 1} times within "
                    f"{RESTART_WINDOW_S:.0f}s: {error}"
                ) from None
            log.warning(
                "computation %s failed (restart %d of %d): %s",
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
        for runner in self.runners.values():
            with contextlib.suppress(Exception):
                runner.query.stop()


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
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    def _signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping after the current batches", signum)
        stop.set()

    previous = {s: signal.signal(s, _signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.ExitStack() as stack:
            ends = stack.enter_context(endpoints(settings, embedded=embedded))
            app = Application(topology, settings, ends, spark=None)
            stack.enter_context(
                serve_metrics(settings, ends.redis_url, topology.app, lambda: app.spark)
            )
            # Topics first: an unreachable broker fails here, before the JVM starts.
            app.prepare()
            app.spark = spark_session(settings, f"millstream.{topology.app}")
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
