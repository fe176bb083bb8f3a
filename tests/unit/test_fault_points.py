"""The product's fault points: silent without a hook, hooks installed in-process or by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from millstream.errors import ConfigurationError
from millstream.fault_points import (
    ENV_HOOK,
    fault_point,
    install_fault_hook,
    load_hook,
    remove_fault_hook,
)


def test_installed_hooks_run_in_order_until_removed() -> None:
    seen: list[str] = []

    def first(name: str) -> None:
        seen.append(f"first {name}")

    def second(name: str) -> None:
        seen.append(f"second {name}")

    install_fault_hook(first)
    install_fault_hook(second)
    try:
        fault_point("after_redis_commit")
        remove_fault_hook(first)
        fault_point("after_kafka_commit")
    finally:
        remove_fault_hook(first)  # already gone: ignored
        remove_fault_hook(second)
    fault_point("after_kafka_commit")  # no hook left
    assert seen == [
        "first after_redis_commit",
        "second after_redis_commit",
        "second after_kafka_commit",
    ]


def test_a_hook_that_raises_stops_the_step() -> None:
    def refuse(name: str) -> None:
        raise RuntimeError(f"fault at {name}")

    install_fault_hook(refuse)
    try:
        with pytest.raises(RuntimeError, match="fault at before_kafka_commit"):
            fault_point("before_kafka_commit")
    finally:
        remove_fault_hook(refuse)


# A process where no test code runs first (like a Spark worker): several threads reach their
# first fault point at once; the hook named by the environment must be loaded exactly once.
CHILD = textwrap.dedent(
    """
    import threading
    from millstream.fault_points import fault_point

    threads = [threading.Thread(target=fault_point, args=(f"p{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fault_point("last")
    """
)

HOOK_MODULE = textwrap.dedent(
    """
    import os

    def record(name):
        with open(os.environ["HOOK_LOG"], "a") as log:
            log.write(name + "\\n")
    """
)


def _child(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "recording_hook.py").write_text(HOOK_MODULE)
    base = {k: v for k, v in os.environ.items() if k != ENV_HOOK}
    pythonpath = os.pathsep.join(p for p in (str(tmp_path), base.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**base, "PYTHONPATH": pythonpath, "HOOK_LOG": str(tmp_path / "log"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_environment_names_the_hook_of_every_process(tmp_path: Path) -> None:
    done = _child({ENV_HOOK: "recording_hook:record"}, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "log").read_text().splitlines()
    assert sorted(lines) == sorted([f"p{i}" for i in range(8)] + ["last"])  # once each


def test_without_the_variable_no_hook_is_loaded(tmp_path: Path) -> None:
    done = _child({}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "log").exists()


def test_a_bad_hook_name_fails_the_fault_point_with_the_variable_named(tmp_path: Path) -> None:
    done = _child({ENV_HOOK: "recording_hook:nowhere"}, tmp_path)
    assert done.returncode == 1
    assert "ConfigurationError" in done.stderr and ENV_HOOK in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("millstream.testing._crash", "expected module:function"),
        (":crash_point", "expected module:function"),
        ("no_such_module_xyz:hook", "cannot load it"),
        ("millstream.testing._crash:no_such_function", "cannot load it"),
        ("millstream.testing._crash:POINTS", "not callable"),
    ],
)
def test_load_hook_refuses_what_it_cannot_call(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_hook(spec)


def test_load_hook_finds_the_crash_hook() -> None:
    from millstream.testing._crash import HOOK, crash_point

    assert load_hook(HOOK) is crash_point
