"""`Topology.join` declares a store and a joiner, and refuses what would break its guarantees."""

from __future__ import annotations

from typing import Any

import pytest

from millstream import (
    Computation,
    ConfigurationError,
    JoinRetry,
    Topology,
    json_field,
    kafka_source,
)
from millstream.connectors.join_log import JoinLog
from millstream.connectors.join_operator import EventStoreOperator, JoinOperator
from millstream.connectors.throttle import Throttle, decide
from millstream.testing import TopologyTestDriver


def _topology(**overrides: Any) -> Topology:
    topology = Topology("photon")
    topology.source("clicks", kafka_source("c"))
    topology.source("queries", kafka_source("q"))
    options: dict[str, Any] = dict(
        primary="clicks", primary_id=json_field("click_id"), secondary="queries",
        secondary_id=json_field("query_id"), lookup=json_field("query_id"),
        combine=lambda click, query: query, output="joined",
    )  # fmt: skip
    options.update(overrides)
    return topology.join("joiner", **options)


def test_a_join_is_a_store_then_a_joiner_gated_on_its_output() -> None:
    topology = _topology()
    topology.validate()
    assert list(topology.computations) == ["joiner-store", "joiner"]
    store, joiner = (topology.computations[n].operator for n in topology.computations)
    assert isinstance(store, EventStoreOperator) and isinstance(joiner, JoinOperator)
    assert joiner.gated_streams == ("joined",) and joiner.registry == "joiner"
    assert topology.computations["joiner"].outputs >= {"joined", "unjoined"}


def test_backoff_doubles_to_its_cap_with_deterministic_jitter() -> None:
    retry = JoinRetry(first_ms=100, max_ms=1_000, give_up_ms=10_000)
    delays = [retry.delay(n, "c1") for n in range(6)]
    assert delays == [retry.delay(n, "c1") for n in range(6)]  # a re-run waits the same
    for n, delay in enumerate(delays):
        base = min(1_000, 100 << n)
        assert base <= delay <= base + base // 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"retry": JoinRetry(first_ms=0)}, "first_ms"),
        ({"retry": JoinRetry(first_ms=500, max_ms=100)}, "max_ms is below"),
        ({"retry": 5}, "JoinRetry"),
        ({"combine": "nope"}, "combine must be callable"),
        ({"unjoined": "joined"}, "two streams"),
        ({"registry": "a:b"}, "registry name"),
        ({"productions": "weak"}, "strong productions"),
        ({"cache_ttl_s": 0}, "cache_ttl_s"),
        ({"max_waiting": 0}, "max_waiting must be an int >= 1"),
        ({"max_waiting": "many"}, "max_waiting must be an int >= 1"),
        ({"log": JoinLog(window_ms=0)}, "log window_ms must be an int >= 1"),
        ({"log": JoinLog(max_records=True)}, "log max_records must be an int >= 1"),
        ({"log": JoinLog(max_bytes=-1)}, "log max_bytes must be an int >= 1"),
        ({"log": 300_000}, "log must be a JoinLog"),
        ({"lookup_time": 5}, "lookup_time must be callable"),
        ({"log": None, "lookup_time": lambda click: 0}, "log=None turns it off"),
    ],
)
def test_bad_declarations_are_refused_with_the_reason(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _topology(**overrides)


def test_a_join_output_read_inside_the_application_is_refused() -> None:
    class Reader(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            pass

    topology = _topology()
    topology.computation("reader", Reader(), inputs=["joined"])
    with pytest.raises(ConfigurationError, match="only after its registry insert"):
        topology.validate()


def test_the_topology_test_driver_says_it_does_not_run_joins() -> None:
    with pytest.raises(ConfigurationError, match="does not run joins yet"):
        TopologyTestDriver(_topology())


def test_the_joiner_throttles_its_primary_by_waiting_clicks_unless_unbounded() -> None:
    joiner = _topology(max_waiting=50, retry=JoinRetry(give_up_ms=9_000)).computations["joiner"]
    assert joiner.operator.throttle() == Throttle(("clicks",), 50, 9_000)
    default = _topology().computations["joiner"].operator.throttle()
    assert default is not None and default.max_waiting == 10_000
    assert _topology(max_waiting=None).computations["joiner"].operator.throttle() is None
    assert _topology().computations["joiner-store"].operator.throttle() is None


def test_the_throttle_pauses_above_the_bound_and_lets_a_batch_in_after_the_give_up_time() -> None:
    throttle = Throttle(("clicks",), max_waiting=100, max_hold_ms=5_000)
    assert decide(100, throttle, None, 0) == "idle"  # at the bound: no pause
    assert decide(101, throttle, None, 0) == "engage"
    assert decide(150, throttle, 1_000, 5_999) == "hold"
    assert decide(100, throttle, 1_000, 2_000) == "release"
    # Waiting clicks give up only as the watermark moves, which a pause holds: after the
    # give-up time one batch gets in, then the throttle engages again if still over.
    assert decide(150, throttle, 1_000, 6_000) == "breathe"


def test_the_runtime_marks_kafka_and_log_file_primaries_for_the_throttle(tmp_path: Any) -> None:
    """`throttle=true` reaches every source of a join's primary stream that reads the flag
    (`injectors/_throttle_flag.py`), Kafka and log files alike, and no other source."""
    from millstream.connectors.query_sources import READ_AHEAD, source_options
    from millstream.connectors.targets import Endpoints
    from millstream.injectors.sources import logfile_source
    from millstream.settings import Settings

    topology = Topology("photon")
    topology.source("clicks", kafka_source("c"), logfile_source(str(tmp_path)))
    topology.source("queries", kafka_source("q"))
    topology.join(
        "joiner", primary="clicks", primary_id=json_field("click_id"), secondary="queries",
        secondary_id=json_field("query_id"), lookup=json_field("query_id"),
        combine=lambda click, query: query, output="joined",
    )  # fmt: skip
    settings = Settings(
        redis_url="redis://r:6379/0", kafka_bootstrap_servers="k:9092", app="photon"
    )
    ends = Endpoints(redis_url="redis://r:6379/0", kafka={"bootstrap.servers": "k:9092"})
    sources = source_options(
        topology, settings, ends, {}, ["clicks", "queries"], [], str, "/tmp/checkpoint"
    )
    marked = {(fmt, opts["stream"]): opts.get("throttle") for fmt, opts in sources}
    assert marked == {
        ("millstream-kafka", "clicks"): "true",
        ("millstream-logfile", "clicks"): "true",
        ("millstream-kafka", "queries"): None,
    }
    # The queries, which clicks wait for, are admitted READ_AHEAD batches' worth at a time.
    budgets = {(fmt, o["stream"]): int(o["maxRecordsPerTrigger"]) for fmt, o in sources}
    assert budgets == {
        ("millstream-kafka", "clicks"): settings.max_records_per_batch,
        ("millstream-logfile", "clicks"): settings.max_records_per_batch,
        ("millstream-kafka", "queries"): READ_AHEAD * settings.max_records_per_batch,
    }
    assert READ_AHEAD > 1
