"""`millstream bench --quick` smoke: the command runs, prints its table and writes its files.

Only the dedup scenario (state layer on real Redis, no Spark) keeps this under a minute; the
Spark scenarios are exercised by `make bench`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    # Issue #16's targets: none of their scenarios ran, so none is measured (never invented).
    targets = json.loads((out / "targets.json").read_text())
    assert targets and all(t["measured"] is None and t["met"] is None for t in targets)
    assert all(t["detail"].startswith("not measured in this run") for t in targets)
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
