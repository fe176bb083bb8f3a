"""The test-only crash points (`millstream.testing._crash`) and the backpressure setting.

The "pipeline" below calls the product's `fault_point`, as the runtime does; the crash hook
reaches it only through the environment `with_crash_hook` builds, as in real pipelines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from millstream.errors import ConfigurationError
from millstream.settings import Settings
from millstream.testing._crash import session_members, with_crash_hook

# A "pipeline": a session leader with a child in the same session, hitting crash points.
SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    from millstream.fault_points import fault_point
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print("CHILD", child.pid, flush=True)
    try:
        fault_point("after_kafka_commit")  # another point: not counted
        fault_point("after_redis_commit")
        print("HIT 1", flush=True)
        fault_point("after_redis_commit")
        print("SURVIVED", flush=True)
    finally:
        child.kill()
        child.wait()
    """
)


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=with_crash_hook({**os.environ, **env}),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )


def test_the_nth_hit_kills_every_process_of_the_session(tmp_path: Path) -> None:
    counter = tmp_path / "crash"
    done = _run(
        {
            "MILLSTREAM_TEST_CRASH_AT": "after_redis_commit:2",
            "MILLSTREAM_TEST_CRASH_FILE": str(counter),
        }
    )
    assert done.returncode == -9, done.stderr
    assert "HIT 1" in done.stdout and "SURVIVED" not in done.stdout
    child = int(done.stdout.split("CHILD", 1)[1].split()[0])
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the session's other process survived"
    lines = counter.read_text().splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [
        ["after_redis_commit", "1"],
        ["after_redis_commit", "2"],
    ]
    assert lines[2] == "CRASH after_redis_commit 2"


def test_without_the_variable_nothing_happens(tmp_path: Path) -> None:
    done = _run({"MILLSTREAM_TEST_CRASH_FILE": str(tmp_path / "crash")})
    assert done.returncode == 0 and "SURVIVED" in done.stdout
    assert not (tmp_path / "crash").exists()


@pytest.mark.parametrize("spec", ["after_redis_commit:0", "nowhere", "after_kafka_commit:x"])
def test_a_bad_spec_is_refused(spec: str, tmp_path: Path) -> None:
    done = _run({"MILLSTREAM_TEST_CRASH_AT": spec})
    assert done.returncode == 1 and "MILLSTREAM_TEST_CRASH_AT" in done.stderr


def test_session_members_lists_a_session_but_not_the_caller() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        assert session_members(proc.pid) == [proc.pid]
        assert os.getpid() not in session_members(os.getsid(0))
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_max_pending_productions_is_validated() -> None:
    assert Settings.from_env({}).max_pending_productions == 100_000
    env = {"MILLSTREAM_MAX_PENDING_PRODUCTIONS": "250"}
    assert Settings.from_env(env).max_pending_productions == 250
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ConfigurationError, match="MILLSTREAM_MAX_PENDING_PRODUCTIONS"):
            Settings.from_env({"MILLSTREAM_MAX_PENDING_PRODUCTIONS": bad})
