"""The broker's own CPU during a run, when it runs on this machine: how a slowing broker shows.

A pipeline's watermark lag depends on how fast the broker answers its fetches. The embedded
broker (Tansu 0.6.0, memory storage) answers a fetch more slowly the more record batches the
partition holds: under the bench's generator (1,000 events/s, batches of one or two records)
a plain consumer reading a partition's new records every 0.2 s took 51 ms per read at first
and 2 s after 35-40 s, while the broker's CPU rose from 0.2 to a whole core (README, the
embedded broker's defects). Apache Kafka finds a fetch's offset by its index, whatever the
partition's length. So the watermarks scenario samples the broker process's CPU beside the
lag, and reports both per 10 s of traffic with the driver read's time, and the latency scenario
gives the broker's mean CPU over each rate phase of each system: every lag and latency figure
read with the broker's load beside it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on `port` (IPv4 and IPv6), from /proc/net."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])  # state 0A: LISTEN
    return found


def listening_pid(bootstrap: str) -> int | None:
    """The pid of the process on this machine listening at the first bootstrap server's port;
    None for a remote broker or when it cannot be told (another user's process)."""
    first = bootstrap.split(",")[0].strip().rsplit("://", 1)[-1]
    host, _, port = first.rpartition(":")
    if host.strip("[]") not in LOCAL_HOSTS or not port.isdigit():
        return None
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(int(port))}
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
            except OSError:  # closed meanwhile (the listing's own descriptor among them)
                continue
    return None


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds the process `pid` has spent so far; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSeries(threading.Thread):
    """One process's CPU (cores busy) once per `interval_s`: (wall-clock ms, cores)."""

    def __init__(self, pid: int, interval_s: float = 1.0) -> None:
        super().__init__(name=f"cpu-{pid}", daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[int, float]] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        last = (time.monotonic(), cpu_seconds(self.pid))
        while not self._halt.wait(self.interval_s):
            now, cpu = time.monotonic(), cpu_seconds(self.pid)
            if cpu is None or last[1] is None:
                return  # the process ended
            self.samples.append(
                (int(time.time() * 1000), round((cpu - last[1]) / (now - last[0]), 3))
            )
            last = (now, cpu)


def per_window(
    points: list[tuple[int, float]], start_ms: int, end_ms: int, window_s: float, statistic: Any
) -> list[float | None]:
    """`statistic` (mean, median, ...) of the values in each `window_s` from `start_ms` to
    `end_ms`; None for a window without a value."""
    width = int(window_s * 1000)
    out: list[float | None] = []
    for begin in range(start_ms, end_ms, width):
        values = [v for t, v in points if begin <= t < begin + width]
        out.append(round(float(statistic(values)), 3) if values else None)
    return out


def over_time_line(found: dict[str, Any], stage: str) -> str:
    """A watermarks run's figures per window of traffic (its `over_time`), in one line."""
    series = found.get("over_time") or {}

    def fmt(values: list[float | None] | None) -> str:
        return " ".join("-" if v is None else f"{v:g}" for v in values) if values else "-"

    broker = series.get("broker_cores")
    return (
        f"per {series.get('window_s', 10):g} s of traffic: {stage} lag median s "
        f"{fmt(series.get('lag_median_s'))}; driver read p50 s {fmt(series.get('read_p50_s'))}; "
        f"{stage} shards p50 s {fmt(series.get('shards_p50_s'))}; broker process CPU cores "
        + (fmt(broker) if broker else "not sampled (the broker is not on this machine)")
    )


def phase_figures(
    systems: dict[str, list[dict[str, Any]]], field: str, spec: str = ""
) -> list[str]:
    """Each system's `field` per rate phase ("<system> <rate>/s <value>, ..."), formatted by
    `spec`, for the systems that measured it."""
    return [
        f"{name} "
        + ", ".join(
            f"{p['rate']:.0f}/s {p[field]:{spec}}" for p in phases if p.get(field) is not None
        )
        for name, phases in systems.items()
        if any(p.get(field) is not None for p in phases)
    ]


def broker_line(systems: dict[str, list[dict[str, Any]]]) -> str:
    """The broker's mean CPU during each system's rate phases, in one line."""
    parts = phase_figures(systems, "broker_cores")
    if not parts:
        return "broker CPU: not sampled (the broker is not on this machine)"
    return "broker process CPU (cores, mean over each phase): " + "; ".join(parts)
