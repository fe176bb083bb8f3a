"""Short demos in CI, as users run them: the Zeitgeist demo with a SIGKILL of the pipeline
mid-run, and the Photon demo (two pipelines active-active on one registry, one SIGKILLed, one
paused), each with its full verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from millstream.testing.committed_reader import (
    COMMIT_MARKER,
    last_stable_offset,
    read_raw_topic,
    record_origins,
)
from tests.e2e.sink_faults import _open_transactions


def window_topic_story(bootstrap: str, output: Path) -> str:
    """Where the demo's window counts sit in its sink topic, partition by partition: records
    per transaction outcome (COMMIT, ABORT, no marker yet), open transactions, the broker's
    last stable offset, and the windows a read_committed consumer does not see; then the
    pipeline log's warnings. Tells a count never delivered from one the broker withholds."""
    lines: list[str] = []
    for config_path in sorted(output.glob("*/config.json")):
        topic = json.loads(config_path.read_text())["window_topic"]
        try:
            partitions = read_raw_topic(bootstrap, topic)
        except Exception as exc:
            lines.append(f"{topic} unreadable: {type(exc).__name__}: {exc}")
            continue
        for partition, batches in enumerate(partitions):
            origins = record_origins(partition, batches)
            markers = Counter(str(o.marker) for o in origins.values())
            try:
                lso: object = last_stable_offset(bootstrap, topic, partition)
            except Exception as exc:
                lso = f"unreadable ({exc})"
            end = batches[-1].next_offset if batches else 0
            lines.append(
                f"{topic} p{partition}: records by marker {dict(markers)}, open transactions "
                f"(first offset, pid, created) {_open_transactions(batches)}, last stable "
                f"offset {lso}, log end {end}"
            )
            unseen = [
                (o.offset, o.producer_id, o.producer_epoch, o.marker, o.value[:80])
                for o in origins.values()
                if o.marker not in (COMMIT_MARKER, "")
            ]
            lines.extend(f"   not committed: {u}" for u in unseen[:15])
        log = config_path.parent / "pipeline.log"
        if log.exists():
            warnings = [
                line[:300]
                for line in log.read_text(errors="replace").splitlines()
                if " WARNING " in line or " ERROR " in line
            ]
            lines.extend(["pipeline log warnings:", *warnings[-30:]])
    return "\n".join(lines)


def test_short_demo_with_a_crash_passes_verification(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MILLSTREAM_STATE_DIR": str(tmp_path / "state"),
    }
    cli = [sys.executable, "-m", "millstream.cli", "demo", "--duration", "40", "--rate", "300"]
    done = subprocess.run(
        [*cli, "--json", "--output", str(tmp_path / "demo")],
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    stderr = done.stderr.decode(errors="replace")
    assert done.stdout, f"no JSON summary; stderr tail:\n{stderr[-3000:]}"
    summary = json.loads(done.stdout)
    failed = [c for c in summary["checks"] if not c["passed"]]
    if done.returncode != 0 or not summary["passed"]:
        story = window_topic_story(kafka_bootstrap, tmp_path / "demo")
        raise AssertionError(f"failed checks: {failed}\n{story}")
    assert summary["faults"] and summary["faults"][0]["type"].startswith("SIGKILL")
    assert summary["counts"]["duplicates_sent"] > 0 and summary["counts"]["late_sent"] > 0
    for plot in summary["plots"]:
        assert Path(plot).stat().st_size > 10_000, f"{plot} is missing or empty"


def test_short_photon_demo_with_its_faults_passes_verification(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MILLSTREAM_STATE_DIR": str(tmp_path / "state"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "demo", "--job", "photon", "--duration", "24",
         "--json", "--output", str(tmp_path / "photon")],
        env=env, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    stderr = done.stderr.decode(errors="replace")
    assert done.stdout, f"no JSON summary; stderr tail:\n{stderr[-3000:]}"
    summary = json.loads(done.stdout)
    failed = [c for c in summary["checks"] if not c["passed"]]
    assert done.returncode == 0 and summary["passed"], f"failed checks: {failed}"
    assert summary["at_most_once_violations"] == 0 and summary["samples"] > 40
    assert summary["exactly_once"] and summary["unjoined"] > 0 and summary["lost_races"] > 0
    assert [f["type"].split()[0] for f in summary["faults"]] == ["SIGKILL", "SIGSTOP"]
    assert all(v["joined"] > 0 for v in summary["per_pipeline"].values())
    assert summary["latency_on_time_s"]["p50"] is not None
    assert "progress" not in summary and "[" in stderr  # progress lines went to stderr
    assert Path(summary["plot"]).stat().st_size > 10_000


def test_demo_rejects_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "demo", "--duration", "5"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert b"--duration must be at least 20 seconds" in done.stderr
