"""`millstream bench` smoke tests: the command runs, prints its table and writes its files.

The command runs only the dedup scenario (state layer on real Redis, no Spark), which keeps it
under a minute. One tiny millstream pipeline process, as the Spark scenarios start it (the
throughput scenario's, a few thousand events, both variants), checks that a bench pipeline
runs on the one runtime; the full Spark scenarios are exercised by `make bench`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("millstream")


def _command() -> list[str]:
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "millstream.cli"]


def _env(redis_url: str, bootstrap: str, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")}
    env.update(
        REDIS_URL=redis_url, KAFKA_BOOTSTRAP_SERVERS=bootstrap, MILLSTREAM_STATE_DIR=str(state)
    )
    return env


def test_bench_quick_dedup_writes_table_json_and_machine(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [*_command(), "bench", "--quick", "--scenarios", "dedup", "--output", str(out)],
        env=_env(redis_url, kafka_bootstrap, tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dedup cost per shard batch" in done.stdout
    machine = json.loads((out / "machine.json").read_text())
    assert machine["command"].startswith("millstream bench --quick")
    assert machine["cores"] and machine["spark"] and machine["redis"]
    rows = json.loads((out / "dedup.json").read_text())["rows"]
    for row in rows:
        if row["duplicates"] == 0 and row["bloom"]:
            assert row["reads_per_record"] == 0  # the Bloom filter answers every new id
        if not row["bloom"]:
            assert row["reads_per_record"] == 1  # without it, every id goes to the catalog
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenarios"]["dedup"]["ok"] is True
    # Issue #16's targets: none of their scenarios ran, so none is measured (never invented);
    # the catalog's bytes per retained id is the dedup scenario's own.
    targets = json.loads((out / "targets.json").read_text())
    catalog = [t for t in targets if t["name"] == "catalog bytes per retained id"]
    others = [t for t in targets if t not in catalog]
    assert catalog and catalog[0]["met"] is True, catalog
    assert others and all(t["measured"] is None and t["met"] is None for t in others)
    assert all(t["detail"].startswith("not measured in this run") for t in others)
    assert "## Targets" in (out / "README.md").read_text()


def test_bench_rejects_an_unknown_scenario(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_command(), "bench", "--scenarios", "nope", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown scenario" in done.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_a_bench_pipeline_process_counts_every_event_on_the_one_runtime(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The throughput scenario's millstream process, tiny: a warm-up application, then the
    exactly-once and exactly_once=False window counts, one after the other in one Spark
    session; each started with one `app.start()` and no MILLSTREAM_RUNTIME."""
    from millstream.bench._harness import Bench
    from millstream.bench._workload import new_topic, preload
    from millstream.bench.throughput import Variant, run_millstream

    bench = Bench(
        output=tmp_path / "results",
        workdir=tmp_path / "runs",
        redis_url=redis_url,
        bootstrap=kafka_bootstrap,
        quick=True,
        events=2000,
        rates=[1000.0],
        rate_seconds=5.0,
    )
    topic = new_topic(bench.kafka, "bench-smoke")
    preload(bench.kafka, topic, bench.events)
    variants = [Variant("millstream-eo"), Variant("millstream-no-eo", exactly_once=False)]
    rows = run_millstream(bench, topic, bench.events, variants)
    assert [r["system"] for r in rows] == ["millstream-eo", "millstream-no-eo"]
    for row in rows:
        assert row["events_per_s_incl_startup"] > 0
        assert row["peak_rss_mb"] > 0 and row["batches"] > 0
        assert "runtime" not in row and "delivery" not in row
    assert rows[0]["exactly_once"] and not rows[1]["exactly_once"]
    (log,) = {r["log"] for r in rows}  # one process ran both
    # Spark's trigger reports, polled from each query (no listener), each written once, the
    # last batch's too (the run waits for its trigger to end before the last poll).
    for row in rows:
        (query,) = row["spark"].values()
        assert query["triggers"] >= row["batches"] > 0
    reports = [
        json.loads(line)
        for path in (tmp_path / "runs").rglob("progress.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len({(r["run"], r["batch"]) for r in reports}) == len(reports)
    assert all("addBatch" in r["duration_ms"] for r in reports if r["rows"])
    assert "MILLSTREAM_RUNTIME" not in Path(log).read_text(errors="replace")
