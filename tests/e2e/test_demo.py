"""A short Zeitgeist demo in CI: SIGKILL of the pipeline mid-run, then full verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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
    assert done.returncode == 0 and summary["passed"], f"failed checks: {failed}"
    assert summary["faults"] and summary["faults"][0]["type"].startswith("SIGKILL")
    assert summary["counts"]["duplicates_sent"] > 0 and summary["counts"]["late_sent"] > 0
    for plot in summary["plots"]:
        assert Path(plot).stat().st_size > 10_000, f"{plot} is missing or empty"


def test_demo_rejects_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "demo", "--duration", "5"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert b"--duration must be at least 20 seconds" in done.stderr
