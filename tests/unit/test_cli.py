"""The `millstream` command line, in process: help, version, demo options and error lines.

Nothing here starts a service or touches the network: every error case fails before that, and
`embedded_services` is replaced by a guard that fails the test if a demo would really start.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import millstream
from millstream.cli import build_parser, main
from millstream.demo.options import from_args

SUBCOMMANDS = ("version", "infra", "run", "status", "state", "reset", "demo", "bench", "chaos")
DEMO_FLAGS = (
    "--duration",
    "--rate",
    "--duplicates",
    "--late",
    "--seed",
    "--no-fault",
    "--output",
    "--json",
    "--shards",
    "--queries",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No configuration leaks in from the caller's environment; no files land in the repo."""
    for name in list(os.environ):
        if name.startswith("MILLSTREAM_") or name in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_demo_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """If validation let a bad option through, fail here instead of starting Redis and Kafka."""
    import millstream.embedded

    @contextmanager
    def refuse(*args: Any, **kwargs: Any) -> Iterator[tuple[str, str]]:
        raise AssertionError("the demo would have started: its options were accepted")
        yield ("", "")  # pragma: no cover

    monkeypatch.setattr(millstream.embedded, "embedded_services", refuse)


def _exit_code(argv: list[str]) -> int | str | None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return exited.value.code


# ---------------------------------------------------------------- help and version


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: millstream")
    for command in SUBCOMMANDS:
        assert command in out
    assert "exactly-once" in out.lower()
    assert err == ""


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "usage: millstream" in err
    assert "required" in err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    out, err = capsys.readouterr()
    assert out == f"millstream {millstream.__version__}\n"
    assert err == ""
    assert millstream.__version__ == importlib.metadata.version("millstream")


def test_demo_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["demo", "--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: millstream demo")
    for flag in DEMO_FLAGS:
        assert flag in out
    assert "(default 120)" in out
    assert err == ""


def test_status_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["status", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--app" in out


# ---------------------------------------------------------------- demo --duration


@pytest.mark.parametrize("duration", ["5", "19.9", "0", "-30"])
@pytest.mark.usefixtures("no_demo_services")
def test_demo_rejects_a_too_short_duration(
    duration: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--duration", duration]) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert "--duration must be at least 20 seconds" in err


@pytest.mark.parametrize("duration", ["abc", "", "20s"])
@pytest.mark.usefixtures("no_demo_services")
def test_demo_rejects_a_non_numeric_duration(
    duration: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(["demo", "--duration", duration]) == 2
    err = capsys.readouterr().err
    assert f"argument --duration: invalid float value: '{duration}'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("duration", ["nan", "inf"])
def test_demo_rejects_a_non_finite_duration(duration: str) -> None:
    # Checked on the options alone: through main() an accepted value would start the demo.
    args = build_parser().parse_args(["demo", "--duration", duration])
    with pytest.raises(ValueError, match="--duration"):
        from_args(args)


@pytest.mark.usefixtures("no_demo_services")
def test_demo_accepts_the_minimum_duration() -> None:
    args = build_parser().parse_args(["demo", "--duration", "20"])
    assert isinstance(args, argparse.Namespace)
    assert from_args(args).duration == 20.0


# ---------------------------------------------------------------- errors become one line


@pytest.mark.parametrize(
    ("env", "argv", "names"),
    [
        ({"REDIS_URL": "http://x"}, ["status"], "REDIS_URL='http://x' is invalid"),
        ({"MILLSTREAM_SHRADS": "4"}, ["status"], "unknown variable MILLSTREAM_SHRADS"),
        ({"MILLSTREAM_SHARDS": "0"}, ["status", "--json"], "MILLSTREAM_SHARDS='0' is invalid"),
        ({"MILLSTREAM_SHARDS": "0"}, ["infra", "status"], "MILLSTREAM_SHARDS='0' is invalid"),
        ({}, ["run", "no-colon-here"], "expected module:attribute"),
    ],
)
def test_configuration_errors_are_one_line(
    env: dict[str, str],
    argv: list[str],
    names: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("millstream: error: ")
    assert err.count("\n") == 1, err
    assert names in err


def test_redis_password_is_masked_in_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://user:hunter2@localhost:6379/zero")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "redis://user:***@localhost:6379/zero" in err
