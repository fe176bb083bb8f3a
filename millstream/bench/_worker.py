"""A benchmark pipeline process: `python -m millstream.bench._worker CONFIG.json`.

Runs in its own process group (driver, JVM, Python workers) so the benchmark can sample the
whole tree's memory and stop all of it. Like `millstream.run`, but several topologies can run
one after the other in one Spark session, and each is started and then waited for until every
computation has committed its first batch. An application is one fused query (its
computations started together by one `app.start()`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from millstream.bench._harness import PROGRESS_FILE
from millstream.bench._topologies import build
from millstream.connectors.app import Application, endpoints
from millstream.connectors.spark_session import spark_session
from millstream.settings import Settings
from millstream.state.client import connect
from millstream.state.keys import app_key

FIRST_BATCH_TIMEOUT_S = 300.0


# Trigger reports each query keeps (spark.sql.streaming.numRecentProgressUpdates): more than a
# poll interval's worth at any trigger interval the bench uses.
RETAINED_PROGRESS = 1000


class ProgressPoller:
    """Appends each trigger's progress (query name, batch id, rows, Spark's durationMs:
    latestOffset, getBatch, queryPlanning, addBatch = foreachBatch, walCommit, commitOffsets,
    triggerExecution) to `path`, one JSON line per trigger: where a batch's time goes outside
    the runtime's own code.

    Polled from each query's retained reports, the new ones only (two py4j calls each), not
    from a Python StreamingQueryListener: PySpark builds a listener's event field by field over
    py4j on every trigger, and measured beside a lifted window count that cost the pipeline
    about a tenth of its throughput (interleaved A/B, 200,000 events: 18.3k against 20.8k
    events/s), a cost Quix Streams and the plain Spark baselines do not pay."""

    def __init__(self, spark: Any, path: Path, interval_s: float = 1.0) -> None:
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(RETAINED_PROGRESS))
        self.spark = spark
        self.path = path
        self.interval_s = interval_s
        self.written: dict[str, int] = {}  # run id -> last batch id written
        self.lock = threading.Lock()  # the poller's thread and the run's end both poll
        self.thread = threading.Thread(target=self._run, name="bench-progress", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:  # a daemon thread: ends with the process
            time.sleep(self.interval_s)
            self.poll()

    def settle(self, timeout_s: float = 5.0) -> None:
        """Wait, at most `timeout_s`, until the trigger each query runs now has ended.

        A run ends on its counted metrics, which its last batch writes inside its trigger;
        Spark records that trigger's report as the trigger ends (and only then marks the query's
        status inactive), so a poll straight after the count can miss the run's last report.
        Triggers run one after another, so once a query is seen between triggers, every
        trigger begun before the wait has been reported."""
        try:
            pending = list(self.spark.streams.active)
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                pending = [query for query in pending if query.status["isTriggerActive"]]
                if pending:
                    time.sleep(0.02)
        except Exception as exc:  # the JVM ends first at a SIGTERM of the process group
            logging.getLogger(__name__).debug("progress settle: %s", exc)

    def poll(self) -> None:
        """Write the reports triggered since the last poll (none once the JVM is gone)."""
        with self.lock:
            try:
                lines = [line for query in self.spark.streams.active for line in self._new(query)]
            except Exception as exc:  # the JVM ends first at a SIGTERM of the process group
                logging.getLogger(__name__).debug("progress poll: %s", exc)
                return
            if lines:
                with self.path.open("a") as out:
                    out.writelines(json.dumps(line) + "\n" for line in lines)

    def _new(self, query: Any) -> list[dict[str, Any]]:
        reports = query._jsq.recentProgress()  # newest last, at most RETAINED_PROGRESS
        lines: list[dict[str, Any]] = []
        for index in range(len(reports) - 1, -1, -1):
            progress = json.loads(reports[index].json())
            if progress["batchId"] <= self.written.get(progress["runId"], -1):
                break
            lines.append(
                {
                    "query": progress.get("name"),
                    "run": progress["runId"],
                    "batch": progress["batchId"],
                    "timestamp": progress["timestamp"],
                    "rows": progress.get("numInputRows", 0),
                    "duration_ms": progress.get("durationMs", {}),
                }
            )
        if lines:
            self.written[lines[0]["run"]] = lines[0]["batch"]
        return lines[::-1]


def _start_staggered(app: Application, client: Any, stop: threading.Event) -> None:
    """Start the application's computations (one `app.start()`: the fused query over all of
    them) and wait, restarting a failed query, until each has committed a first batch or
    FIRST_BATCH_TIMEOUT_S has passed; the next topology of the series starts only then."""
    app.start()
    keys = [app_key(app.topology.app, "metrics", name) for name in app.topology.computations]
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while not stop.is_set() and time.monotonic() < deadline:
        app.check()
        if all(int(client.hget(key, "batches") or 0) > 0 for key in keys):
            break
        stop.wait(0.2)


def _counted(app: Application, client: Any, events: int) -> bool:
    return all(
        int(client.hget(app_key(app.topology.app, "metrics", name), "records") or 0) >= events
        for name in app.topology.computations
    )


def run_settings(settings: Settings, run_config: dict[str, Any]) -> Settings:
    """The settings of one run of the series: its `driver_read` and `overlap_delivery`
    ("on"/"off") when it names them (the throughput scenario's variants), else the process's."""
    for name in ("driver_read", "overlap_delivery"):
        value = run_config.get(name)
        if value is None:
            continue
        if value not in ("on", "off"):
            raise ValueError(f"{name} must be on or off, not {value!r}")
        if name == "driver_read":
            settings = dataclasses.replace(settings, driver_read=value == "on")
        else:
            settings = dataclasses.replace(settings, overlap_delivery=value == "on")
    return settings


def main(argv: list[str]) -> int:
    """CONFIG is one topology config, or `{"runs": [config, ...], "events": N}`: topologies run
    one after the other in the same Spark session, each until every computation counted N
    (or the run's own `events`); the last one runs until SIGTERM. A run's `driver_read`
    ("on"/"off"), when set, overrides MILLSTREAM_DRIVER_READ for that run only."""
    config = json.loads(Path(argv[1]).read_text())
    runs = config.get("runs", [config])
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    def _signal(signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _signal)
    with endpoints(settings) as ends:
        client = connect(ends.redis_url)
        spark = None
        progress: ProgressPoller | None = None
        for index, run_config in enumerate(runs):
            app = Application(build(run_config), run_settings(settings, run_config), ends, None)
            app.prepare()
            if spark is None:
                spark = spark_session(settings, f"millstream.{app.topology.app}")
                progress = ProgressPoller(spark, Path(settings.state_dir) / PROGRESS_FILE)
            app.spark = spark
            last = index == len(runs) - 1
            try:
                _start_staggered(app, client, stop)
                while not stop.is_set():
                    app.check()
                    events = int(run_config.get("events", config.get("events", 0)))
                    if not last and _counted(app, client, events):
                        break
                    stop.wait(0.5 if not last else 1.0)
            finally:
                if progress is not None:
                    progress.settle()  # the trigger that wrote the last count has reported
                    progress.poll()  # the run's last reports, while its queries are active
                app.stop()
            if stop.is_set():
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
