"""`millstream run` with MILLSTREAM_METRICS_PORT: /metrics scraped over HTTP while it runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from millstream.embedded import free_port
from tests.e2e.run_target import OUT_OF_ORDER_MS

RECORDS = 200
# Once every record is read, the input is idle: its low watermark follows the clock this far
# behind it, less the stream's allowance for records out of order. That is the watermark lag the
# scrape must show, give or take how old the last published watermark is.
IDLE_SLACK_MS = 3000
EXPECTED_LAG_S = (IDLE_SLACK_MS + OUT_OF_ORDER_MS) / 1000


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_scrape_counts_every_record_and_shows_the_watermark(
    redis_url: str,
    kafka_bootstrap: str,
    kafka_topic_factory: Any,
    redis_namespace: str,
    tmp_path: Path,
) -> None:
    topic = kafka_topic_factory(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(RECORDS):
        producer.produce(topic, key=f"k{i % 5}", value=b"v", headers=[("id", f"r{i}".encode())])
    assert producer.flush(10) == 0
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")},
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MILLSTREAM_APP": redis_namespace,
        "MILLSTREAM_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "MILLSTREAM_SHARDS": "2",
        "MILLSTREAM_STATE_DIR": str(tmp_path / "state"),
        "MILLSTREAM_METRICS_PORT": str(port),
        "MILLSTREAM_IDLE_SLACK_MS": str(IDLE_SLACK_MS),
        "RUN_TARGET_TOPIC": topic,
    }
    url = f"http://127.0.0.1:{port}/metrics"
    labels = (("app", redis_namespace), ("computation", "tally"))
    app = (("app", redis_namespace),)
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "millstream.cli", "run", "tests.e2e.run_target:topology"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(Path(__file__).parents[2]),
        )
    try:
        got: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        deadline = time.monotonic() + 240
        while got.get(("millstream_records_total", labels), 0) < RECORDS:
            assert proc.poll() is None, f"millstream run exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"records never reached {RECORDS}: {got}\n{log.read_text()[-3000:]}"
            )
            time.sleep(1)
            try:
                got = scrape(url)
            except (urllib.error.URLError, ConnectionError):
                continue  # not serving yet: the server starts once the endpoints are known
        assert got[("millstream_records_total", labels)] == RECORDS
        assert got[("millstream_redis_up", app)] == 1.0

        # The watermark series appear once a batch published one, and a query's progress once
        # its first trigger ended (a batch's records are committed before that): a few scrapes.
        def ages() -> list[Any]:
            return [k for k in got if k[0] == "millstream_spark_last_progress_age_seconds"]

        while ("millstream_low_watermark_ms", labels) not in got or not ages():
            assert time.monotonic() < deadline, f"no low watermark or query progress: {got}"
            time.sleep(1)
            got = scrape(url)
        # The lag against this test's own clock: now (taken around the scrape) minus the
        # scraped low watermark; and, every record read, EXPECTED_LAG_S behind now or a little
        # more (a published watermark is up to a batch and a tick old).
        time.sleep(2)
        before = time.time()
        got = scrape(url)
        after = time.time()
        low = got[("millstream_low_watermark_ms", labels)]
        lag = got[("millstream_watermark_lag_seconds", labels)]
        assert before - low / 1000 - 0.002 <= lag <= after - low / 1000 + 0.002, (lag, low)
        assert EXPECTED_LAG_S - 0.002 <= lag <= EXPECTED_LAG_S + 5, (lag, EXPECTED_LAG_S)
        assert got[("millstream_spark_up", app)] == 1.0
        assert got[("millstream_spark_active_queries", app)] >= 1
        assert ages()
        assert got[("millstream_batches_total", labels)] >= 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]
    try:  # the server stopped with the pipeline
        scrape(url)
        raise AssertionError("/metrics still answers after millstream run exited")
    except (urllib.error.URLError, ConnectionError):
        pass
