"""Process-level fault plumbing on real processes (no Spark needed to prove the signals land)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from millstream.testing.faults import PipelineProcess

# A parent whose child moves to a process group of its own, as Spark's Python daemon does:
# signals must reach it through the session, not the group.
TREE = (
    "import os, subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); time.sleep(60)']);"
    " time.sleep(60)"
)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _members(proc: PipelineProcess, count: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        members = proc.members()
        if len(members) == count:
            return members
        time.sleep(0.05)
    raise AssertionError(f"expected {count} processes, found {proc.members()}")


def test_pause_resume_and_kill9_reach_every_process_of_the_session(tmp_path: Path) -> None:
    proc = PipelineProcess([sys.executable, "-c", TREE], dict(os.environ), tmp_path / "p.log")
    proc.start()
    try:
        members = _members(proc, 2)
        assert sum(m.rss_bytes for m in proc.rss()) > 1_000_000
        proc.pause()
        time.sleep(0.2)
        assert {_state(p) for p in members} == {"T"}  # both stopped, the other group too
        proc.resume()
        time.sleep(0.2)
        assert "T" not in {_state(p) for p in members}
        proc.kill9()
        assert not proc.alive()
        _members(proc, 0)
    finally:
        proc.stop(timeout=5)
