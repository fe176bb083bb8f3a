"""Windows and combiners: assignment at the boundaries, sessions merging, allowed lateness and
updates, closed-window cleanup (through TopologyTestDriver, which calls the runtime's window
operator), and lifting giving the unlifted results on the same input, duplicates included."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from typing import Any

import pytest

from millstream import (
    Combiner,
    ConfigurationError,
    Count,
    Hopping,
    Max,
    Mean,
    Min,
    Session,
    Sum,
    Topology,
    Tumbling,
    json_field,
    kafka_source,
)
from millstream.connectors.fresh_records import KeyRecords
from millstream.connectors.key_runner import KeyRunner
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.windows import merge_overlapping
from millstream.records import Production, Record, TimeDomain
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import Watermark
from millstream.testing import TopologyTestDriver

T0 = 1_700_000_000_000  # a multiple of 10 s


# --- assignment --------------------------------------------------------------------------------
def test_tumbling_boundaries_are_half_open() -> None:
    w = Tumbling(10)
    assert w.assign(0) == [(0, 10)]
    assert w.assign(9) == [(0, 10)]
    assert w.assign(10) == [(10, 20)]
    assert w.assign(-1) == [(-10, 0)]


def test_hopping_assigns_every_window_containing_the_time() -> None:
    w = Hopping(10, 5)
    assert w.assign(5) == [(0, 10), (5, 15)]
    assert w.assign(4) == [(-5, 5), (0, 10)]
    assert w.assign(9) == [(0, 10), (5, 15)]
    assert Hopping(10, 3).assign(10) == [(3, 13), (6, 16), (9, 19)]
    for t in range(-50, 50):
        windows = Hopping(10, 3).assign(t)
        assert all(s <= t < e for s, e in windows)
        assert len(windows) in (3, 4)


def test_bad_window_declarations_name_the_problem() -> None:
    with pytest.raises(ConfigurationError, match="size_ms"):
        Tumbling(0)
    with pytest.raises(ConfigurationError, match="longer than size_ms"):
        Hopping(10, 20)
    with pytest.raises(ConfigurationError, match="gap_ms"):
        Session(-1)
    topology = Topology("t").source("s", kafka_source("s"))
    with pytest.raises(ConfigurationError, match="aggregate must be"):
        topology.window("w", stream="s", window=Tumbling(10), aggregate=len, output="o")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="late='flag' does not apply"):
        topology.window(
            "w", stream="s", window=Tumbling(10), aggregate=Count(), output="o", late="flag"
        )
    with pytest.raises(ConfigurationError, match="allowed_lateness_ms"):
        topology.window(
            "w", stream="s", window=Tumbling(10), aggregate=Count(), output="o",
            allowed_lateness_ms=-5,
        )  # fmt: skip


def test_overlapping_sessions_merge_transitively() -> None:
    groups = merge_overlapping([(0, 10), (20, 30), (5, 15), (14, 21), (40, 50)])
    assert groups == {(0, 30): [(0, 10), (5, 15), (14, 21), (20, 30)], (40, 50): [(40, 50)]}
    assert merge_overlapping([(0, 10), (10, 20)]) == {(0, 10): [(0, 10)], (10, 20): [(10, 20)]}


# --- combiners ---------------------------------------------------------------------------------
def _record(value: Any, ts: int = 0) -> Record:
    return Record(key="k", value=json.dumps(value).encode(), timestamp=ts, id=b"x", system_time=0)


@pytest.mark.parametrize(
    ("combiner", "values", "expected"),
    [
        (Count(), [{"v": 1}, {"v": 5}], 2),
        (Sum("v"), [{"v": 1}, {"v": 2.5}], 3.5),
        (Min("v"), [{"v": 3}, {"v": -2}, {"v": 7}], -2),
        (Max("v"), [{"v": 3}, {"v": -2}, {"v": 7}], 7),
        (Mean("v"), [{"v": 1}, {"v": 2}, {"v": 6}], 3.0),
        (Sum(), [4, 5], 9),
        (Sum(lambda r: len(r.value)), ["ab", "abc"], 9),
    ],
)
def test_builtin_combiners_fold_and_merge_alike(
    combiner: Combiner, values: list[Any], expected: Any
) -> None:
    inputs = [combiner.extract(_record(v)) for v in values]
    acc = combiner.create()
    for v in inputs:
        acc = combiner.add(acc, v)
    assert combiner.result(acc) == expected
    # Split anywhere and merged: the same result (what lifting relies on).
    for cut in range(len(inputs) + 1):
        left, right = combiner.create(), combiner.create()
        for v in inputs[:cut]:
            left = combiner.add(left, v)
        for v in inputs[cut:]:
            right = combiner.add(right, v)
        assert combiner.result(combiner.merge(left, right)) == expected


def test_a_value_without_the_field_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no field 'v'"):
        Sum("v").extract(_record({"w": 1}))
    with pytest.raises(ValueError, match="not a finite number"):
        Sum("v").extract(_record({"v": "3"}))
    with pytest.raises(ValueError, match="not a finite number"):
        Max("v").extract(_record({"v": True}))


# --- the operator through TopologyTestDriver ---------------------------------------------------
def _driver(window: Any, aggregate: Combiner, **kwargs: Any) -> TopologyTestDriver:
    topology = Topology("w").source("views", kafka_source("views"))
    topology.window(
        "agg", stream="views", key=json_field("page"), window=window, aggregate=aggregate,
        output="out", **kwargs,
    )  # fmt: skip
    return TopologyTestDriver(topology, start_ms=T0)


def _results(driver: TopologyTestDriver) -> list[tuple[str, int, int, Any, bool, int]]:
    out = []
    for p in driver.output("out"):
        v = json.loads(p.value)
        assert p.key == v["key"]
        assert p.timestamp == v["end"]  # stamped at the window's end
        out.append(
            (v["key"], v["start"] - T0, v["end"] - T0, v["result"], v["update"], p.timestamp - T0)
        )
    return out


def test_tumbling_count_emits_each_window_once_when_the_watermark_passes_its_end() -> None:
    d = _driver(Tumbling(10_000), Count())
    for i, ts in enumerate([1, 2, 9_999, 10_000, 15_000]):
        d.send("views", {"page": "/a"}, timestamp=T0 + ts, id=f"r{i}")
    d.send("views", {"page": "/a"}, timestamp=T0 + 3, id="r0")  # a duplicate
    d.advance_watermark(T0 + 9_999)
    assert _results(d) == []  # a record at 9,999 could still come
    d.advance_watermark(T0 + 10_000)
    assert _results(d) == [("/a", 0, 10_000, 3, False, 10_000)]
    d.advance_watermark(T0 + 30_000)
    assert _results(d)[1:] == [("/a", 10_000, 20_000, 2, False, 20_000)]
    assert d.state("agg", "/a") is None  # closed windows are deleted with their timers
    assert d.timers("agg") == []
    assert d.metrics("agg")["duplicates"] == 1


def test_hopping_sum_counts_a_record_in_each_of_its_windows() -> None:
    d = _driver(Hopping(10_000, 5_000), Sum("n"))
    d.send("views", {"page": "/a", "n": 2}, timestamp=T0 + 7_000, id="a")
    d.send("views", {"page": "/a", "n": 3}, timestamp=T0 + 12_000, id="b")
    d.advance_watermark(T0 + 40_000)
    assert [(s, e, r) for _, s, e, r, _, _ in _results(d)] == [
        (0, 10_000, 2),
        (5_000, 15_000, 5),
        (10_000, 20_000, 3),
    ]


def test_sessions_merge_when_a_record_bridges_two() -> None:
    d = _driver(Session(1_000), Count())
    d.send("views", {"page": "/a"}, timestamp=T0 + 0, id="a")
    d.send("views", {"page": "/a"}, timestamp=T0 + 1_500, id="b")
    assert len(d.timers("agg", "/a")) == 2  # two sessions so far
    d.send("views", {"page": "/a"}, timestamp=T0 + 800, id="c")  # bridges [0,1000) and [1500,2500)
    assert [t.tag for t in d.timers("agg", "/a")] == [f"{T0}:{T0 + 2_500}"]
    d.send("views", {"page": "/b"}, timestamp=T0 + 100, id="d")
    d.advance_watermark(T0 + 10_000)
    assert sorted(_results(d)) == [
        ("/a", 0, 2_500, 3, False, 2_500),
        ("/b", 100, 1_100, 1, False, 1_100),
    ]
    assert d.state("agg", "/a") is None


def test_allowed_lateness_updates_and_reemits_then_cleans_up() -> None:
    d = _driver(Tumbling(10_000), Max("v"), allowed_lateness_ms=5_000)
    d.send("views", {"page": "/a", "v": 1}, timestamp=T0 + 1_000, id="a")
    d.advance_watermark(T0 + 12_000)
    assert _results(d) == [("/a", 0, 10_000, 1, False, 10_000)]
    assert d.state("agg", "/a") is not None  # kept for its lateness
    d.send("views", {"page": "/a", "v": 9}, timestamp=T0 + 2_000, id="b")  # late, within it
    assert _results(d)[1:] == [("/a", 0, 10_000, 9, True, 10_000)]
    assert d.late("agg") == 0
    d.advance_watermark(T0 + 15_000)  # lateness over: the window is gone
    assert d.state("agg", "/a") is None and d.timers("agg") == []
    d.send("views", {"page": "/a", "v": 20}, timestamp=T0 + 3_000, id="c")  # past it
    assert len(_results(d)) == 2
    assert d.late("agg") == 1
    assert d.metrics("agg")["window_updates"] == 1


def test_records_past_the_lateness_can_be_dead_lettered() -> None:
    d = _driver(Tumbling(10_000), Count(), late="dead-letter")
    d.advance_watermark(T0 + 20_000)
    d.send("views", {"page": "/a"}, timestamp=T0 + 1, id="a")
    [letter] = d.dead_letters()
    assert "late" in json.loads(letter.value)["error"]
    assert d.late("agg") == 1


def test_a_record_with_a_bad_value_is_a_dead_letter_and_the_others_count() -> None:
    d = _driver(Tumbling(10_000), Sum("n"))
    d.send("views", {"page": "/a", "n": 1}, timestamp=T0 + 1, id="a")
    d.send("views", {"page": "/a", "x": 1}, timestamp=T0 + 2, id="b")
    d.advance_watermark(T0 + 10_000)
    assert [r for *_, r, _u, _t in _results(d)] == [1]
    [letter] = d.dead_letters()
    assert "no field 'n'" in json.loads(letter.value)["error"]


class TopTwo(Combiner):
    """A user combiner: the two largest values."""

    def create(self) -> list[int]:
        return []

    def add(self, acc: list[int], value: Any) -> list[int]:
        return sorted([*acc, value["n"]], reverse=True)[:2]

    def merge(self, acc: list[int], other: list[int]) -> list[int]:
        return sorted([*acc, *other], reverse=True)[:2]


def test_a_user_combiner() -> None:
    d = _driver(Tumbling(10_000), TopTwo())
    for i, n in enumerate([3, 9, 1, 7]):
        d.send("views", {"page": "/a", "n": n}, timestamp=T0 + i, id=str(i))
    d.advance_watermark(T0 + 10_000)
    assert [r for *_, r, _u, _t in _results(d)] == [[9, 7]]


# --- lifting: the same results as unlifted on one batch ----------------------------------------
class _Store:
    """An in-memory shard transaction."""

    def __init__(self) -> None:
        self.states: dict[str, bytes | None] = {}
        self.timers: dict[tuple[str, str], int] = {}
        self.productions: list[Production] = []

    def set_state(self, key: str, value: bytes) -> None:
        self.states[key] = value

    def delete_state(self, key: str) -> None:
        self.states.pop(key, None)

    def set_timer(
        self, key: str, tag: str, time: int, domain: TimeDomain, hold: int | None = None
    ) -> None:
        self.timers[(key, tag)] = time

    def delete_timer(self, key: str, tag: str) -> None:
        self.timers.pop((key, tag), None)

    def checkpoint(self, production: Production) -> Production:
        self.productions.append(production)
        return production


def _plan(watermark: int) -> BatchPlan:
    return BatchPlan(
        app="a", batch_id=1, redis_url="", shards=1, shard_config=ShardConfig(use_bloom=False),
        input_watermark=Watermark(watermark, watermark), gc_watermark=0, now=T0 + 100_000,
        user_retries=0, fail_stop=False, internal_inputs=frozenset(), deliveries={},
        in_flight_streams=frozenset(),
    )  # fmt: skip


@pytest.mark.parametrize(
    "window", [Tumbling(1_000), Hopping(1_000, 250), Session(300)], ids=lambda w: w.describe()
)
@pytest.mark.parametrize(
    "aggregate", [Count(), Sum("n"), Mean("n"), Min("n"), Max("n")], ids=lambda c: c.describe()
)
def test_lifted_and_unlifted_fold_batches_to_the_same_state_and_results(
    window: Any, aggregate: Combiner
) -> None:
    rng = random.Random(7)
    sent = [
        (f"k{rng.randrange(4)}", T0 + rng.randrange(5_000), rng.randrange(10)) for _ in range(400)
    ]
    sent += rng.sample(sent, 20)  # duplicates the source sent again: dedup is the shard task's
    outcomes = []
    # Lifted as the shard task runs it (a key's batch as `KeyRecords` over routed rows: no
    # Record built for a built-in), lifted over records (as a list of pairs), and unlifted.
    for mode in ("rows", "records", "unlifted"):
        lift = mode != "unlifted"
        topology = Topology("w").source("s", kafka_source("s"))
        topology.window(
            "agg", stream="s", window=window, aggregate=aggregate, output="o", lift=lift
        )
        spec = topology.computations["agg"]
        store = _Store()
        states: dict[str, bytes | None] = {}
        # Four batches, records in order of arrival; the watermark behind all of them.
        for part in range(4):
            runner = KeyRunner(_plan(T0 - 1), spec, states, store)
            by_key: dict[str, list[tuple[Record, tuple]]] = defaultdict(list)
            rows: dict[str, list[TaskInput]] = defaultdict(list)
            for key, ts, n in sent[part::4]:
                value = json.dumps({"n": n}).encode()
                record = Record(key, value, ts, b"id", ts)
                by_key[key].append((record, ()))
                row = ("s", b"id", None, value, ts, ts, "s", 0, len(rows[key]), None, None)
                rows[key].append(TaskInput(key, row, None))
            for key, batch in by_key.items():
                if mode == "rows":
                    keyed = KeyRecords(rows[key], frozenset())
                    spec.operator.process_key(runner, key, keyed)
                else:
                    spec.operator.process_key(runner, key, batch)
        # Close everything: fire each window's timer in time order.
        runner = KeyRunner(_plan(T0 + 100_000), spec, states, store)
        from millstream.records import Timer

        due = sorted(store.timers.items(), key=lambda kv: (kv[1], kv[0]))
        if lift:  # a key's windows closed in one call, as the shard task fires them
            by_key: dict[str, list[Timer]] = defaultdict(list)
            for (key, tag), time_ in due:
                by_key[key].append(Timer(key, tag, time_))
            store.timers.clear()
            for key, timers in by_key.items():
                spec.operator.process_timers(runner, key, timers)
        for (key, tag), time_ in due if not lift else []:
            if (key, tag) in store.timers:
                del store.timers[(key, tag)]
                spec.operator.process_timer(runner, Timer(key, tag, time_))
        results = sorted(
            (
                p.key,
                json.loads(p.value)["start"],
                json.loads(p.value)["end"],
                json.loads(p.value)["result"],
            )
            for p in store.productions
        )
        outcomes.append((results, store.states))
    truth = _ground_truth(sent, window, aggregate)
    assert outcomes[0][0] == outcomes[1][0] == outcomes[2][0] == truth
    assert outcomes[0][1] == outcomes[1][1] == outcomes[2][1] == {}


def _ground_truth(sent: list[tuple[str, int, int]], window: Any, aggregate: Combiner) -> list:
    """Computed without the operator: windows by arithmetic, sessions by sorting."""
    members: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    if isinstance(window, Session):
        for key in {k for k, _, _ in sent}:
            times = sorted((ts, n) for k, ts, n in sent if k == key)
            start, end, values = times[0][0], times[0][0] + window.gap_ms, []
            for ts, n in times:
                if ts >= end:
                    members[(key, start, end)] = values
                    start, values = ts, []
                end = max(end, ts + window.gap_ms)
                values.append(n)
            members[(key, start, end)] = values
    else:
        size = window.size_ms
        every = getattr(window, "every_ms", size)
        for key, ts, n in sent:
            for start in range(ts - ts % every - size + every, ts + 1, every):
                if start <= ts < start + size:
                    members[(key, start, start + size)].append(n)
    out = []
    for (key, start, end), values in members.items():
        if isinstance(aggregate, Count):
            result: Any = len(values)
        elif isinstance(aggregate, Sum):
            result = sum(values)
        elif isinstance(aggregate, Min):
            result = min(values)
        elif isinstance(aggregate, Max):
            result = max(values)
        else:
            result = sum(values) / len(values)
        out.append((key, start, end, result))
    return sorted(out)
