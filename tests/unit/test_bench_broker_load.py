"""The watermarks scenario's figures over time: the broker process found by its listening port,
its CPU sampled, and lag, read, shards and broker CPU per 10 s of traffic."""

from __future__ import annotations

import os
import socket
import statistics
import time

from millstream.bench._broker_load import CpuSeries, listening_pid, over_time_line, per_window
from millstream.bench.watermarks import over_time


def test_the_process_listening_at_a_local_bootstrap_port_is_found() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening_pid(f"127.0.0.1:{port}") == os.getpid()
        assert listening_pid(f"localhost:{port},other:9092") == os.getpid()
    assert listening_pid(f"127.0.0.1:{port}") is None  # closed: nobody listens
    assert listening_pid("kafka.example.com:9092") is None  # not on this machine


def test_cpu_series_counts_a_busy_process_and_stops_when_it_ends() -> None:
    series = CpuSeries(os.getpid(), interval_s=0.2)
    series.start()
    deadline = time.monotonic() + 0.7
    while time.monotonic() < deadline:
        sum(range(1000))  # keep this process busy
    series.stop()
    series.join(2)
    assert len(series.samples) >= 2
    assert max(cores for _, cores in series.samples) > 0.3
    gone = CpuSeries(2**22 + 12345, interval_s=0.05)  # no such pid
    gone.start()
    gone.join(2)
    assert not gone.is_alive() and gone.samples == []


def test_per_window_gives_each_windows_statistic_and_none_for_an_empty_one() -> None:
    points = [(1000, 1.0), (1500, 3.0), (12_000, 5.0), (35_000, 7.0)]
    assert per_window(points, 1000, 31_000, 10, statistics.fmean) == [2.0, 5.0, None]


def test_over_time_lines_up_lag_read_shards_and_broker_per_window() -> None:
    start = 1_000_000
    samples = [{"t": start + 1000 * i, "window_counter": 300 + 100 * (i // 10)} for i in range(30)]
    fused = {
        i: {
            "batch_id": i,
            "rows": 0 if i % 5 == 4 else 200,  # empty batches do not count
            "seen_ms": start + 1000 * i,
            "phases": {"read": 0.01 * (1 + i // 10), "window_counter:shards": 0.04},
        }
        for i in range(30)
    }
    broker = [(start + 1000 * i, 0.2 + 0.3 * (i // 10)) for i in range(30)]
    found = over_time(samples, fused, broker, start, start + 30_000)
    assert found["lag_median_s"] == [0.3, 0.4, 0.5]
    assert found["read_p50_s"] == [0.01, 0.02, 0.03]
    assert found["shards_p50_s"] == [0.04, 0.04, 0.04]
    assert found["broker_cores"] == [0.2, 0.5, 0.8]
    line = over_time_line({"over_time": found}, "window_counter")
    assert "window_counter lag median s 0.3 0.4 0.5" in line
    assert "broker process CPU cores 0.2 0.5 0.8" in line
    remote = over_time(samples, fused, None, start, start + 30_000)
    assert remote["broker_cores"] is None
    assert "not sampled" in over_time_line({"over_time": remote}, "window_counter")


def test_latency_reports_the_brokers_cpu_per_phase_of_each_system() -> None:
    from millstream.bench._broker_load import broker_line
    from millstream.bench.latency import Phase
    from millstream.bench.tail_targets import _broker_during

    mine = [
        Phase(1000.0, 0, 30_000, 30_000, 0.3).__dict__,
        Phase(5000.0, 33_000, 63_000, 150_000, 0.9).__dict__,
    ]
    floor = [
        Phase(1000.0, 0, 30_000, 30_000, 0.2).__dict__,
        Phase(5000.0, 33_000, 63_000, 150_000, 0.7).__dict__,
    ]
    assert Phase(**mine[1]).broker_cores == 0.9  # the JSON form reads back
    line = broker_line({"millstream exactly-once": mine, "Spark floor": floor})
    assert (
        "millstream exactly-once 1000/s 0.3, 5000/s 0.9; Spark floor 1000/s 0.2, 5000/s 0.7" in line
    )
    assert "0.9 cores (millstream), 0.7 (floor)" in _broker_during(mine, floor, 5000.0)
    remote = [Phase(5000.0, 0, 1, 1).__dict__]
    assert "not sampled" in broker_line({"millstream exactly-once": remote})
    assert _broker_during(remote, floor, 5000.0) == ""


def test_the_cpu_line_gives_each_systems_cpu_per_event() -> None:
    from millstream.bench.latency import cpu_line

    mine = [
        {"rate": 1000.0, "cpu_us_per_event": 310.5},
        {"rate": 5000.0, "cpu_us_per_event": 150.0},
    ]
    line = cpu_line({"millstream exactly-once": mine, "Quix Streams": [{"rate": 1000.0}]})
    assert (
        line
        == "process tree CPU (us per event sent, each phase): millstream exactly-once 1000/s 310.5, 5000/s 150"
    )
    assert cpu_line({"Quix Streams": [{"rate": 1000.0, "cpu_us_per_event": None}]}).endswith(": -")
