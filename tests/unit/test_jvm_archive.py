"""The JVM class archive is used only whole, only when enabled, and only for its own install."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from millstream import jvm_archive
from millstream.errors import ConfigurationError
from millstream.settings import Settings


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "millstream" / "jvm"


def test_options_map_the_archive_only_once_it_exists_and_when_enabled(cache: Path) -> None:
    path = jvm_archive.archive_path()
    assert path is not None and path.parent == cache
    assert jvm_archive.java_options() == []
    cache.mkdir(parents=True)
    path.write_bytes(b"an archive")
    options = jvm_archive.java_options()
    assert options[0] == f"-XX:SharedArchiveFile={path}"
    assert jvm_archive.java_options(enabled=False) == []


def test_the_key_names_this_java_and_these_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    key = jvm_archive.archive_key()
    assert key is not None and len(key) == 16
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert jvm_archive.archive_key() is None  # no Java: no archive, Spark starts as before


def test_a_failed_build_leaves_no_archive_behind(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        step, temporary = argv[-2], Path(argv[-1])
        temporary.write_bytes(b"half an archive")  # the JVM wrote something, then...
        return subprocess.CompletedProcess(argv, 0 if step == "--warm" else 1, "", "no sharing")

    monkeypatch.setattr(jvm_archive.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="check step"):
        jvm_archive.build()
    assert [c[-2] for c in calls] == ["--warm", "--check"]
    assert list(cache.iterdir()) == []  # neither the final name nor the temporary file


def test_a_checked_build_is_renamed_into_place_and_stale_archives_go(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir(parents=True)
    install = jvm_archive.archive_path().name.split("-")[2]  # type: ignore[union-attr]
    stale = cache / f"spark-driver-{install}-0000000000000000.jsa"
    stale.write_bytes(b"another java's")
    other = cache / "spark-driver-00000000-0000000000000000.jsa"
    other.write_bytes(b"another virtualenv's: still in use there")

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        Path(argv[-1]).write_bytes(b"archive")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(jvm_archive.subprocess, "run", run)
    path = jvm_archive.build()
    assert path.read_bytes() == b"archive"
    assert sorted(cache.iterdir()) == sorted([path, other])


def test_the_setting_is_auto_or_off() -> None:
    assert Settings.from_env({}).jvm_archive == "auto"
    assert Settings.from_env({"MILLSTREAM_JVM_ARCHIVE": "OFF"}).jvm_archive == "off"
    with pytest.raises(ConfigurationError, match="MILLSTREAM_JVM_ARCHIVE"):
        Settings.from_env({"MILLSTREAM_JVM_ARCHIVE": "maybe"})
