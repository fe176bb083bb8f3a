"""The join's log tier, its pure parts: spans merged for one search per batch, which misses go
to the log (the cache's horizon), the query time, and the tier bound to Kafka sources at start."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from millstream import Record, Topology, json_field, kafka_source, logfile_source
from millstream.connectors import join_log
from millstream.connectors.join_log import JoinLog, LogLookup, look_in_log, query_time
from millstream.connectors.join_operator import JoinOperator
from millstream.connectors.stage_plan import PlanContext, plan_stages
from millstream.connectors.targets import Endpoints
from millstream.injectors import event_log
from millstream.injectors.event_log import LogSearch, merge_spans
from millstream.settings import Settings


def test_windows_merge_into_sorted_disjoint_spans() -> None:
    assert merge_spans([]) == []
    assert merge_spans([(50, 60), (0, 10), (5, 20), (21, 30), (40, 45)]) == [
        (0, 30),  # overlapping and touching windows are one span
        (40, 45),
        (50, 60),
    ]
    assert merge_spans([(0, 100), (10, 20)]) == [(0, 100)]  # one inside another


def _click(ts: int, value: bytes = b"{}") -> Record:
    return Record(key="c", value=value, timestamp=ts, id=b"i", system_time=ts)


def test_the_query_time_is_lookup_time_else_the_clicks_own() -> None:
    assert query_time(None, _click(1_000)) == 1_000
    assert query_time(lambda click: click.timestamp - 300, _click(1_000)) == 700
    for bad in (lambda click: "700", lambda click: True, lambda click: 7.5):
        with pytest.raises(TypeError, match="expected int ms"):
            query_time(bad, _click(1_000))


class _Runner:
    def __init__(self, now: int) -> None:
        self.plan = SimpleNamespace(now=now, redis_url="redis://unused:1/0")
        self.counters: dict[str, int] = {}

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount


def test_only_misses_older_than_the_cache_ttl_are_searched_in_one_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []

    def search(sources: Any, id_of: Any, wants: dict, **bounds: int) -> LogSearch:
        calls.append({"wants": wants, **bounds})
        return LogSearch(scanned=7, bytes=70)

    monkeypatch.setattr(event_log, "search", search)
    lookup = LogLookup(JoinLog(window_ms=100, max_records=5, max_bytes=50), (), json_field("q"),
                       "app:es:j", cache_ttl_s=10)  # fmt: skip
    runner = _Runner(now=100_000)
    recent = {"c1": ("q1", 95_000)}  # 5 s old: the cache may still get it, the click waits
    assert look_in_log(runner, lookup, recent) == {}  # type: ignore[arg-type]
    assert calls == [] and runner.counters == {}
    misses = {"c1": ("q1", 95_000), "c2": ("q2", 90_000), "c3": ("q2", 80_000), "c4": ("q3", 1)}
    assert look_in_log(runner, lookup, misses) == {}  # type: ignore[arg-type]
    [call] = calls  # one search for the batch's old misses
    assert call["wants"] == {"q2": [(89_900, 90_100), (79_900, 80_100)], "q3": [(-99, 101)]}
    assert (call["max_records"], call["max_bytes"]) == (5, 50)
    assert runner.counters == {"log_lookups": 3, "log_searches": 1, "log_scanned": 7,
                               "log_scanned_bytes": 70, "log_found": 0}  # fmt: skip


def _join_topology(secondary_source: Any, **overrides: Any) -> Topology:
    topology = Topology("photon")
    topology.source("clicks", kafka_source("c"))
    topology.source("queries", secondary_source)
    options: dict[str, Any] = dict(
        primary="clicks", primary_id=json_field("click_id"), secondary="queries",
        secondary_id=json_field("query_id"), lookup=json_field("query_id"),
        combine=lambda click, query: query, output="joined",
    )  # fmt: skip
    options.update(overrides)
    return topology.join("joiner", **options)


def _joiner(topology: Topology, kafka: dict[str, str]) -> JoinOperator:
    ctx = PlanContext(topology, Settings(), Endpoints("redis://127.0.0.1:9/0", kafka))
    operator = plan_stages(ctx, list(topology.computations))["joiner"].spec.computation
    assert isinstance(operator, JoinOperator)
    return operator


def test_the_log_tier_is_bound_at_start_to_the_secondary_kafka_sources_with_the_app_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = _join_topology(kafka_source("q-topic", id_header="id"))
    assert topology.computations["joiner"].operator.log_sources == ()  # nothing bound yet
    kafka = {"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL"}
    joiner = _joiner(topology, kafka)
    [source] = joiner.log_sources
    assert source.topics == ("q-topic",) and source.bootstrap_servers == "broker:9093"
    assert source.kafka["security.protocol"] == "SASL_SSL"  # the injectors' security settings
    assert joiner.log_tier == JoinLog() and joiner.cache_ttl_s == 3600
    # Without a Kafka source (a log file) there is no log tier, and a WARNING says so.
    joiner = _joiner(_join_topology(logfile_source("/tmp/q")), kafka)
    assert joiner.log_sources == () and joiner._log_lookup() is None
    assert "no log tier" in caplog.text
    off = _joiner(_join_topology(kafka_source("q"), log=None), kafka)
    assert off.log_tier is None and off.log_sources == ()


def test_join_log_default_is_shared_and_valid() -> None:
    expected = JoinLog(window_ms=300_000, max_records=100_000, max_bytes=64 << 20)
    assert expected == join_log.DEFAULT_LOG
    join_log.DEFAULT_LOG.validate("j")
