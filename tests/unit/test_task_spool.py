"""A local master's shard-job files (pure; no Spark): what the driver writes, what a task
attempt writes back, and that nothing of a job outlives it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from millstream.connectors import task_spool
from millstream.connectors.task_spool import Spool


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://host:7077", False),
        ("yarn", False),
        ("k8s://https://api:6443", False),
        ("localhost", False),
    ],
)
def test_only_masters_on_this_machine_spool(master: str, local: bool) -> None:
    assert task_spool.local_master(master) is local


def test_a_job_round_trip_leaves_no_file(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with spool.job(iter([b"first", b"second"])) as paths:
        assert [task_spool.read_payload(p) for p in paths] == [b"first", b"second"]
        # A failed attempt's results and the accepted attempt's: distinct files.
        stray = task_spool.write_results(paths[0], b"from an attempt Spark did not accept")
        accepted = task_spool.write_results(paths[0], b"results")
        assert stray != accepted
        assert task_spool.take_results(accepted) == b"results"
        assert not os.path.exists(accepted)
        assert os.path.exists(stray)
    assert list(spool.folder.iterdir()) == []


def test_a_failed_job_leaves_no_file(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(RuntimeError, match="the job failed"), spool.job([b"payload"]) as paths:
        task_spool.write_results(paths[0], b"half of the job")
        raise RuntimeError("the job failed")
    assert list(spool.folder.iterdir()) == []


def test_a_killed_process_folder_is_removed_by_the_next_spool(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = tmp_path / f"{task_spool.PREFIX}{int(gone.stdout)}-abc"
    dead.mkdir()
    (dead / "0.in").write_bytes(b"left by a kill -9")
    alive = tmp_path / f"{task_spool.PREFIX}1-abc"  # init: always running
    alive.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    spool = Spool(tmp_path)
    with spool.job([b"x"]):
        pass
    assert not dead.exists()
    assert alive.exists() and other.exists() and spool.folder.exists()


def test_payloads_that_fail_midway_leave_no_file(tmp_path: Path) -> None:
    def payloads() -> Iterator[bytes]:
        yield b"written"
        raise MemoryError("building the second payload")

    spool = Spool(tmp_path)
    with pytest.raises(MemoryError), spool.job(payloads()):
        pass
    assert list(spool.folder.iterdir()) == []


def test_a_removed_folder_is_made_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with spool.job([b"a"]):
        pass
    shutil.rmtree(spool.folder)  # a temporary-files cleaner, after a quiet spell
    with spool.job([b"b"]) as paths:
        assert task_spool.read_payload(paths[0]) == b"b"
