"""Prometheus metrics for dashboards: `millstream run` serves them when MILLSTREAM_METRICS_PORT is set.

Everything is read from Redis at scrape time, gathered by `millstream.status` (what `millstream
status` shows), so the metrics do not depend on how the runtime runs its queries; only Spark's
health comes from the driver's SparkSession.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import redis
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from millstream.errors import ConfigurationError, MillstreamError
from millstream.settings import Settings, mask_url
from millstream.state.client import connect
from millstream.status import status

__all__ = ["MillstreamCollector", "serve_metrics"]

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 2.0  # a scrape must answer even when Redis hangs

# status() row field -> (metric name, help); counters get Prometheus's `_total` suffix.
_COUNTERS = (
    ("records", "millstream_records", "Records processed (committed by the shards)."),
    (
        "duplicates_dropped",
        "millstream_duplicates",
        "Records dropped as duplicates of an already applied record id.",
    ),
    ("late_records", "millstream_late_records", "Records behind the input low watermark."),
    ("dead_letters", "millstream_dead_letters", "Records sent to the dead-letter stream."),
    ("batches", "millstream_batches", "Micro-batches completed."),
    (
        "backpressure_seconds",
        "millstream_backpressure_seconds",
        "Seconds input was held by backpressure (finished holds).",
    ),
)
_GAUGES = (
    (
        "pending_productions",
        "millstream_pending_productions",
        "Productions checkpointed but not yet delivered.",
    ),
    ("timers_pending", "millstream_timers_pending", "Timers set and not yet fired."),
    ("last_batch_seconds", "millstream_last_batch_seconds", "Duration of the last batch."),
)


class MillstreamCollector(Collector):
    """Per-computation metrics of one application, read from Redis at each scrape."""

    def __init__(self, redis_url: str, app: str, spark: Callable[[], Any] | None = None) -> None:
        """`spark` returns the driver's SparkSession, or None while it has not started."""
        self.redis_url = redis_url
        self.app = app
        self.spark = spark
        self._ping = redis.Redis.from_url(
            redis_url, socket_connect_timeout=PING_TIMEOUT_S, socket_timeout=PING_TIMEOUT_S
        )

    def describe(self) -> list[Metric]:
        return []  # registering must not reach Redis

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        up = GaugeMetricFamily(
            "millstream_redis_up", "1 if Redis answered this scrape, else 0.", labels=["app"]
        )
        up.add_metric([self.app], 0.0 if snapshot is None else 1.0)
        yield up
        if snapshot is not None:
            yield from self._computations(snapshot)
        if self.spark is not None:
            yield from self._spark(self.spark())

    def _snapshot(self) -> dict[str, Any] | None:
        try:
            self._ping.ping()
            return status(connect(self.redis_url), self.app)
        except (redis.RedisError, MillstreamError, OSError) as exc:
            log.warning("metrics: Redis at %s: %s", mask_url(self.redis_url), exc)
            return None

    def _computations(self, snapshot: dict[str, Any]) -> Iterator[Metric]:
        labels = ["app", "computation"]
        rows = snapshot["computations"]
        now_s = snapshot["at"] / 1000.0
        low = GaugeMetricFamily(
            "millstream_low_watermark_ms",
            "Published low watermark (event time, ms since the epoch); absent until known.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "millstream_watermark_lag_seconds",
            "Now minus the low watermark, in seconds.",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "millstream_backpressure",
            "1 while the computation takes no new input because a target is slow or down.",
            labels=labels,
        )
        counters = [CounterMetricFamily(n, h, labels=labels) for _, n, h in _COUNTERS]
        gauges = [GaugeMetricFamily(n, h, labels=labels) for _, n, h in _GAUGES]
        batch = HistogramMetricFamily(
            "millstream_batch_seconds", "Micro-batch duration in seconds.", labels=labels
        )
        for name, row in rows.items():
            values = [self.app, name]
            if row["lag_ms"] is not None:  # a real event time, not "unknown" or "finished"
                low.add_metric(values, float(row["low_watermark"]))
                lag.add_metric(values, max(now_s - row["low_watermark"] / 1000.0, 0.0))
            held.add_metric(values, 1.0 if row["backpressure_since"] else 0.0)
            for family, (field, _, _) in zip(counters, _COUNTERS, strict=True):
                family.add_metric(values, float(row[field]))
            for gauge, (field, _, _) in zip(gauges, _GAUGES, strict=True):
                if row[field] is not None:
                    gauge.add_metric(values, float(row[field]))
            histogram = row.get("batch_seconds")
            if histogram is not None:
                buckets = [(floatToGoString(bound), float(n)) for bound, n in histogram["buckets"]]
                batch.add_metric(
                    values, [*buckets, ("+Inf", float(histogram["count"]))], histogram["sum"]
                )
        yield from (low, lag, held, *counters, *gauges, batch)

    def _spark(self, session: Any) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "millstream_spark_up",
            "1 if the driver's Spark session answered this scrape, else 0 (also while starting).",
            labels=["app"],
        )
        active = GaugeMetricFamily(
            "millstream_spark_active_queries", "Streaming queries running.", labels=["app"]
        )
        age = GaugeMetricFamily(
            "millstream_spark_last_progress_age_seconds",
            "Seconds since a running query last reported progress.",
            labels=["app", "query"],
        )
        queries: list[Any] | None = None
        progress: list[tuple[str, Any]] = []
        if session is not None:
            try:
                queries = list(session.streams.active)
                progress = [(q.name or str(q.id), q.lastProgress) for q in queries]
            except Exception as exc:  # a JVM that is gone or stopping
                log.warning("metrics: Spark did not answer: %s", exc)
                queries = None
        up.add_metric([self.app], 0.0 if queries is None else 1.0)
        yield up
        if queries is None:
            return
        active.add_metric([self.app], float(len(queries)))
        now = time.time()
        for name, last in progress:
            stamp = _progress_time(last)
            if stamp is not None:
                age.add_metric([self.app, name], max(now - stamp, 0.0))
        yield active
        yield age


def _progress_time(progress: dict[str, Any] | None) -> float | None:
    """Epoch seconds of a StreamingQueryProgress's `timestamp` (ISO 8601, UTC)."""
    if not progress or not progress.get("timestamp"):
        return None
    try:
        return datetime.fromisoformat(str(progress["timestamp"])).timestamp()
    except ValueError:
        return None


@contextlib.contextmanager
def serve_metrics(
    settings: Settings, redis_url: str, app: str, spark: Callable[[], Any] | None = None
) -> Iterator[str | None]:
    """Serve /metrics on MILLSTREAM_METRICS_HOST:PORT while the block runs; yields its URL.

    Does nothing (yields None) when MILLSTREAM_METRICS_PORT is unset. A port that cannot be
    bound is a ConfigurationError, raised before the pipeline starts.
    """
    if settings.metrics_port is None:
        yield None
        return
    registry = CollectorRegistry()
    registry.register(MillstreamCollector(redis_url, app, spark))
    ProcessCollector(registry=registry)  # the driver's own memory and CPU
    host, port = settings.metrics_host, settings.metrics_port
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}): choose another "
            "MILLSTREAM_METRICS_PORT or MILLSTREAM_METRICS_HOST, or unset the port."
        ) from None
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/metrics"
    log.info("serving Prometheus metrics at %s", url)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
