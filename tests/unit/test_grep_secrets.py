"""scripts/grep_secrets.sh: finds the test secret marker in logs and folders, prints it masked.

Files holding the real marker are removed before the test ends: `.ci/run` greps pytest's
basetemp afterwards and must not find this test's own bait.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.secrets import MARKER

SCRIPT = Path(__file__).parents[2] / "scripts" / "grep_secrets.sh"


def grep(*paths: Path, marker: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if marker is not None:
        env["SECRET_MARKER"] = marker
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, paths)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def fake_marker() -> str:
    return f"fake-marker-{uuid.uuid4().hex}"


def test_hits_in_logs_folders_and_binary_files_fail_with_file_line_masked(
    tmp_path: Path, fake_marker: str
) -> None:
    log = tmp_path / "test.log"
    log.write_text(f"line one\nconnecting to redis://u:{fake_marker}-pw@h:1\n")
    nested = tmp_path / "basetemp" / "test_x0" / "spark"
    nested.mkdir(parents=True)
    (nested / "state.bin").write_bytes(b"\x00\x01" + fake_marker.encode() + b"\x02\xff")
    (nested / "clean.log").write_text("nothing here\n")

    result = grep(log, tmp_path / "basetemp", tmp_path / "missing", marker=fake_marker)
    assert result.returncode == 1, result
    assert fake_marker not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"{log}:2:connecting to redis://u:***-pw@h:1" in lines, lines
    assert any(line.startswith(f"{nested / 'state.bin'}:1:") for line in lines), lines
    assert len(lines) == 2, lines
    assert "2 line(s)" in result.stderr and "missing" in result.stderr


def test_clean_paths_pass(tmp_path: Path, fake_marker: str) -> None:
    (tmp_path / "a.log").write_text("all good\n")
    result = grep(tmp_path, marker=fake_marker)
    assert result.returncode == 0, result
    assert "no test secret" in result.stdout


def test_no_path_is_a_usage_error() -> None:
    assert grep().returncode == 2


def test_default_marker_is_the_one_tests_use(tmp_path: Path) -> None:
    bait = tmp_path / "bait.log"
    bait.write_text(f"x {MARKER}-leak y\n")
    try:
        result = grep(bait)
    finally:
        bait.unlink()
    assert result.returncode == 1, result
    assert result.stdout == f"{bait}:1:x ***-leak y\n"
    assert MARKER not in result.stdout + result.stderr
