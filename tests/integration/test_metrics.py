"""Prometheus metrics read from a real Redis holding hand-written metrics, and `status --watch`.

The hashes are what the runtime writes (the driver's metrics hash, the shards' committed
counters and pending productions, the published low watermark); the collector must turn them
into the right series, and say `millstream_redis_up 0` rather than hang when Redis is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from millstream.embedded import free_port
from millstream.errors import ConfigurationError
from millstream.metrics import MillstreamCollector, serve_metrics
from millstream.settings import Settings
from millstream.state.keys import ShardKeys, app_key
from millstream.state.transaction import HOLD
from millstream.state.watermarks import Watermark, WatermarkAuthority, now_ms
from millstream.status import record_batch_seconds

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition text, by name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(collector: MillstreamCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return samples(generate_latest(registry).decode())


def write_computation(client: Any, app: str, name: str, low_watermark: int) -> None:
    """One computation as the runtime leaves it: 2 shards, a held backlog, 3 batches."""
    key = app_key(app, "metrics", name)
    client.hset(
        key,
        mapping={
            "records": 9,  # the driver's tally trails the shards' (a crash): shards win
            "batches": 3,
            "backpressure_seconds": 1.5,
            "backpressure": json.dumps({"since": now_ms() - 4000, "pending": [7, 0]}),
            "last_batch": json.dumps({"batch_id": 2, "seconds": 0.75}),
        },
    )
    pipe = client.pipeline(transaction=False)
    for seconds in (0.05, 0.75, 7.0):
        record_batch_seconds(pipe, key, seconds)
    pipe.execute()
    for shard, counters in enumerate(
        [
            {"records": 6, "duplicates": 2, "late": 1, "dead_letters": 1},
            {"records": 5, "remnants": 1},
        ]
    ):
        keys = ShardKeys(app, name, shard)
        client.set(keys.sequencer, 1)
        client.hset(keys.counters, mapping=counters)
    shard0 = ShardKeys(app, name, 0)
    client.hset(shard0.productions, mapping={f"p{i}": b"checkpoint" for i in range(7)})
    client.zadd(shard0.production_times, {HOLD: low_watermark})
    client.zadd(shard0.timers("event"), {"t1": low_watermark + 1000})
    WatermarkAuthority(client, app).publish(name, Watermark(low_watermark, now_ms()))


def test_collector_turns_the_runtime_hashes_into_series(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    app = redis_namespace
    low = now_ms() - 30_000
    write_computation(redis_client, app, "tally", low)
    redis_client.hset(app_key(app, "metrics", "fresh"), "batches", 0)  # nothing published yet

    got = scrape(MillstreamCollector(redis_url, app))

    def value(metric: str, computation: str = "tally") -> float:
        return got[(metric, (("app", app), ("computation", computation)))]

    assert got[("millstream_redis_up", (("app", app),))] == 1.0
    assert value("millstream_low_watermark_ms") == float(low)
    assert 29.0 < value("millstream_watermark_lag_seconds") < 60.0
    assert value("millstream_records_total") == 11.0
    assert value("millstream_duplicates_total") == 3.0  # duplicates plus remnants
    assert value("millstream_late_records_total") == 1.0
    assert value("millstream_dead_letters_total") == 1.0
    assert value("millstream_batches_total") == 3.0
    assert value("millstream_backpressure_seconds_total") == 1.5
    assert value("millstream_pending_productions") == 7.0
    assert value("millstream_timers_pending") == 1.0
    assert value("millstream_backpressure") == 1.0
    assert value("millstream_last_batch_seconds") == 0.75
    assert value("millstream_batch_seconds_count") == 3.0
    assert value("millstream_batch_seconds_sum") == pytest.approx(7.8)
    labels = (("app", app), ("computation", "tally"))
    assert got[("millstream_batch_seconds_bucket", (*labels, ("le", "0.1")))] == 1.0
    assert got[("millstream_batch_seconds_bucket", (*labels, ("le", "1.0")))] == 2.0
    assert got[("millstream_batch_seconds_bucket", (*labels, ("le", "10.0")))] == 3.0
    assert got[("millstream_batch_seconds_bucket", (*labels, ("le", "+Inf")))] == 3.0
    # A computation without a published watermark has no watermark series, not a made-up one.
    assert value("millstream_backpressure", "fresh") == 0.0
    assert ("millstream_low_watermark_ms", (("app", app), ("computation", "fresh"))) not in got
    assert ("millstream_batch_seconds_count", (("app", app), ("computation", "fresh"))) not in got


def test_other_apps_are_not_reported(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    write_computation(redis_client, redis_namespace + "-other", "tally", now_ms())
    got = scrape(MillstreamCollector(redis_url, redis_namespace))
    assert got[("millstream_redis_up", (("app", redis_namespace),))] == 1.0
    assert not [key for key in got if key[0] == "millstream_records_total"]


def test_redis_down_is_reported_quickly_without_computation_series(redis_namespace: str) -> None:
    collector = MillstreamCollector(f"redis://127.0.0.1:{free_port()}/0", redis_namespace)
    started = time.monotonic()
    got = scrape(collector)
    assert time.monotonic() - started < 10
    assert got[("millstream_redis_up", (("app", redis_namespace),))] == 0.0
    assert not [key for key in got if key[0].startswith("millstream_records")]


def test_spark_not_started_yet_is_spark_up_0(redis_url: str, redis_namespace: str) -> None:
    got = scrape(MillstreamCollector(redis_url, redis_namespace, spark=lambda: None))
    assert got[("millstream_spark_up", (("app", redis_namespace),))] == 0.0
    assert ("millstream_spark_active_queries", (("app", redis_namespace),)) not in got


def test_served_over_http_and_stopped(
    redis_url: str, redis_client: Any, redis_namespace: str
) -> None:
    write_computation(redis_client, redis_namespace, "tally", now_ms() - 5000)
    port = free_port()
    settings = Settings.from_env({"MILLSTREAM_METRICS_PORT": str(port)})
    with serve_metrics(settings, redis_url, redis_namespace) as url:
        assert url == f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            got = samples(response.read().decode())
    labels = (("app", redis_namespace), ("computation", "tally"))
    assert got[("millstream_records_total", labels)] == 11.0
    assert [key for key in got if key[0] == "process_resident_memory_bytes"]
    with pytest.raises(OSError):  # stopped: nothing listens any more
        urllib.request.urlopen(url, timeout=5)


def test_off_without_a_port(redis_url: str, redis_namespace: str) -> None:
    with serve_metrics(Settings.from_env({}), redis_url, redis_namespace) as url:
        assert url is None


def test_a_port_in_use_is_a_one_line_configuration_error(
    redis_url: str, redis_namespace: str
) -> None:
    port = free_port()
    settings = Settings.from_env({"MILLSTREAM_METRICS_PORT": str(port)})
    with (
        serve_metrics(settings, redis_url, redis_namespace),
        pytest.raises(ConfigurationError) as raised,
        serve_metrics(settings, redis_url, redis_namespace),
    ):
        pass
    message = str(raised.value)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in message
    assert "MILLSTREAM_METRICS_PORT" in message and "\n" not in message


def test_status_watch_redraws_until_ctrl_c(
    redis_url: str, redis_client: Any, redis_namespace: str, tmp_path: Path
) -> None:
    write_computation(redis_client, redis_namespace, "tally", now_ms() - 5000)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")},
        "REDIS_URL": redis_url,
        "MILLSTREAM_APP": redis_namespace,
        "PYTHONFAULTHANDLER": "1",  # a crash (one CI run saw SIGSEGV on Ctrl-C) prints its stack
    }
    out, errors = tmp_path / "watch.out", tmp_path / "watch.err"
    # stderr to a file, not a pipe: nobody reads a pipe until the end, and a process whose
    # pipe is full blocks on its next write (Ctrl-C could then never end it).
    with out.open("wb") as sink, errors.open("wb") as err_sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "millstream.cli", "status", "--watch", "0.2"],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=err_sink,
        )
    try:
        deadline = time.monotonic() + 60
        while out.read_text().count("Ctrl-C stops") < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, errors.read_text()
            time.sleep(0.1)
        redis_client.hset(ShardKeys(redis_namespace, "tally", 1).counters, "records", 105)
        # A redraw after the write shows it; wait for one (a loaded machine redraws slowly).
        deadline = time.monotonic() + 30
        while "records 111," not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, errors.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = errors.read_text()
    assert code == 0, err
    assert "Traceback" not in err, err
    frames = out.read_text().split("every 0.2s, ")[1:]
    assert len(frames) >= 3
    assert "tally: " in frames[0] and "records 11," in frames[0]
    assert "records 111," in frames[-1]  # redrawn from Redis, not the first snapshot again
