"""The steady-run scenario's memory verdict (medians per minute, the second-half slope) and
what its pipeline process is started with (environment, topology)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from millstream.bench._harness import Bench
from millstream.bench._topologies import THREE_STAGES, build
from millstream.bench.steady import _slope_mb_per_min, summarise
from millstream.settings import Settings


def _samples(seconds: int, total: float, per_min: float) -> list[dict[str, float]]:
    return [
        {"at": float(t), "total": total + per_min * t / 60, "java": 500.0, "python": 100.0}
        for t in range(0, seconds + 1, 5)
    ]


def test_flat_memory_has_no_growth_and_zero_slope() -> None:
    memory = summarise(_samples(600, 1000.0, 0.0), 600)
    assert memory["total"]["growth_mb"] == 0
    assert memory["total"]["second_half_slope_mb_per_min"] == 0
    assert memory["java"]["first_minute_median_mb"] == 500.0


def test_a_leak_shows_as_growth_and_slope() -> None:
    memory = summarise(_samples(600, 1000.0, 3.0), 600)  # 3 MiB per minute
    assert memory["total"]["second_half_slope_mb_per_min"] == 3.0
    # minute-1 samples 60..115 s (median at 87.5 s), last minute 540..600 s (median at 570 s)
    assert memory["total"]["growth_mb"] == round(3.0 * (570 - 87.5) / 60, 1)
    assert memory["total"]["peak_mb"] == 1030.0


def test_slope_needs_three_points() -> None:
    assert _slope_mb_per_min([(0.0, 1.0), (5.0, 2.0)]) is None


def test_a_bench_pipeline_environment_is_one_a_pipeline_accepts(tmp_path: Path) -> None:
    """The steady (and every) pipeline process gets `Bench.pipeline_env`: no
    MILLSTREAM_RUNTIME (setting it is now a ConfigurationError), and the settings it names."""
    bench = Bench(
        output=tmp_path,
        workdir=tmp_path,
        redis_url="redis://127.0.0.1:6379/0",
        bootstrap="127.0.0.1:9092",
        quick=True,
        events=1000,
        rates=[1000.0],
        rate_seconds=5.0,
    )
    env = bench.pipeline_env("steady-app", tmp_path, idle_slack_ms=500)
    assert "MILLSTREAM_RUNTIME" not in env
    settings = Settings.from_env(env)
    assert (settings.app, settings.idle_slack_ms, settings.trigger_ms) == ("steady-app", 500, 200)
    with pytest.raises(TypeError):
        bench.pipeline_env("steady-app", tmp_path, runtime="fused")  # type: ignore[call-arg]


@pytest.mark.parametrize("kind", ["parts", "three_stage"])
def test_bench_topologies_build_without_a_delivery_option(kind: str) -> None:
    config: dict[str, Any] = {
        "app": "bench-app",
        "bootstrap": "127.0.0.1:9092",
        "input_topic": "in",
        "output_topic": "out",
        "shards": 4,
        "parts": [
            {"name": "pass_eo", "what": "passthrough", "exactly_once": True, "output_topic": "a"},
            {"name": "win", "what": "window", "exactly_once": False, "output_topic": "b"},
        ],
    }
    if kind == "three_stage":
        config["kind"] = "three_stage"
    topology = build(config)
    expected = THREE_STAGES if kind == "three_stage" else ("pass_eo", "win")
    assert tuple(topology.computations) == expected


def test_driver_read_reaches_the_pipeline_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--driver-read` -> Bench.driver_read -> MILLSTREAM_DRIVER_READ of every pipeline (the
    parent's own value is dropped); a scenario can ask for one setting per pipeline (ab), and
    the throughput worker for one per run of its series."""
    import argparse

    from millstream.bench._worker import run_settings
    from millstream.bench.cli import _bench_from, add_arguments

    monkeypatch.setenv("MILLSTREAM_DRIVER_READ", "off")  # the parent's: never inherited

    def bench_for(*argv: str) -> Bench:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--quick", "--output", str(tmp_path), *argv])
        return _bench_from(args, "redis://127.0.0.1:6379/0", "127.0.0.1:9092", tmp_path)

    def read(bench: Bench, **env: Any) -> str:
        found = bench.pipeline_env("app", tmp_path, **env)
        assert Settings.from_env(found).driver_read == (found["MILLSTREAM_DRIVER_READ"] == "on")
        return found["MILLSTREAM_DRIVER_READ"]

    default, off, ab = (
        bench_for(),
        bench_for("--driver-read", "off"),
        bench_for("--driver-read", "ab"),
    )
    assert (default.driver_read, off.driver_read, ab.driver_read) == ("on", "off", "ab")
    assert (read(default), read(off), read(ab)) == ("on", "off", "on")
    assert (default.read_modes(), off.read_modes(), ab.read_modes()) == (
        ["on"],
        ["off"],
        ["off", "on"],
    )
    assert read(ab, driver_read="off") == "off" and read(default, driver_read="off") == "off"
    with pytest.raises(ValueError):
        default.pipeline_env("app", tmp_path, driver_read="ab")
    with pytest.raises(SystemExit):
        bench_for("--driver-read", "sometimes")

    settings = Settings.from_env(default.pipeline_env("app", tmp_path))
    assert run_settings(settings, {}) is settings
    assert run_settings(settings, {"driver_read": "off"}).driver_read is False
    assert run_settings(settings, {"driver_read": "on"}).driver_read is True


def test_a_jvm_child_between_fork_and_exec_is_not_counted_twice() -> None:
    from millstream.bench._harness import _counted

    mb = 1 << 20
    info = {
        10: (1, 10, 150 * mb, "python3"),  # the driver
        11: (10, 10, 558 * mb, "java"),
        12: (11, 10, 558 * mb, "java"),  # forked by the JVM, not yet exec'd
        13: (11, 10, 45 * mb, "python3"),  # the Python worker daemon it launched
        14: (13, 10, 120 * mb, "python3"),  # a worker forked by the daemon: its own memory
        15: (11, 10, 3 * mb, "jspawnhelper"),  # a small helper: counted
    }
    counted = {pid: rss // mb for _, pid, rss in _counted(info, set(info))}
    assert counted == {10: 150, 11: 558, 13: 45, 14: 120, 15: 3}


def test_tree_cpu_keeps_the_time_of_a_child_that_exited() -> None:
    """The per-record CPU of a throughput run is a difference of two samples of the pipeline's
    process tree: a child that burned CPU and was reaped in between must still count."""
    import select
    import subprocess
    import sys

    from millstream.bench._harness import tree_cpu_seconds

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "sys.stdin.readline()\n"
            f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
            "print('reaped', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdin is not None and parent.stdout is not None
        before = tree_cpu_seconds(parent.pid)
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        ready, _, _ = select.select([parent.stdout], [], [], 60)
        assert ready, "the child did not burn and exit within 60 s"
        assert parent.stdout.readline() == b"reaped\n"
        after = tree_cpu_seconds(parent.pid)
        assert after - before >= 0.35, (before, after)
        assert tree_cpu_seconds(parent.pid) < after + 0.1  # the sleeping tree spends nothing
    finally:
        parent.kill()
        parent.wait()
