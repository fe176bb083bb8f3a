"""The injector watermark rule and how the planner applies it: pure code, no broker.

The planner tests drive `OffsetPlanner` over an in-memory partition log that answers probes
the way a Kafka fetch does (high watermark + first record at or after the offset, or the last
record below an end offset).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Mapping

import pytest

from millstream.errors import TransientError
from millstream.injectors._kafka_offsets import (
    InjectorOffset,
    allocate,
    parse_tp,
    tp_key,
)
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors._kafka_plan import OffsetPlanner
from millstream.injectors._kafka_probe import EARLIEST, Peek
from millstream.injectors._kafka_watch import BrokerWatch
from millstream.injectors.kafka import KafkaRange, KafkaStreamReader, ReadAllAvailable
from millstream.injectors.record_ids import derived_id
from millstream.injectors.watermark import (
    OutageHold,
    PartitionProgress,
    advance,
    caught_up_watermark,
    idle_watermark,
    injector_watermark,
    partition_watermark,
)
from millstream.state.watermarks import Watermark, now_ms

NOW = 1_800_000_000_000
SLACK = 2_000

# ---------------------------------------------------------------- the rule


def test_lag_uses_the_next_unread_record() -> None:
    progress = PartitionProgress(Watermark(1_000, 1_500))
    assert progress.has_lag
    assert partition_watermark(progress, NOW, SLACK) == Watermark(1_000, 1_500)


def test_idle_partition_follows_the_clock_minus_slack() -> None:
    progress = PartitionProgress(None)
    assert not progress.has_lag
    assert partition_watermark(progress, NOW, SLACK) == Watermark(NOW - SLACK, NOW - SLACK)
    assert partition_watermark(progress, NOW + 500, SLACK) == idle_watermark(NOW + 500, SLACK)


def test_injector_watermark_is_the_minimum_over_partitions_per_component() -> None:
    parts = [
        PartitionProgress(Watermark(5_000, 9_000)),
        PartitionProgress(Watermark(7_000, 3_000)),
        PartitionProgress(None),
    ]
    assert injector_watermark(parts, NOW, SLACK) == Watermark(5_000, 3_000)


def test_idle_partition_holds_back_a_lagging_one_only_if_older() -> None:
    lagging_future = PartitionProgress(Watermark(NOW + 60_000, NOW + 60_000))
    idle = PartitionProgress(None)
    assert injector_watermark([lagging_future, idle], NOW, SLACK) == idle_watermark(NOW, SLACK)


def test_no_partitions_counts_as_idle() -> None:
    assert injector_watermark([], NOW, SLACK) == idle_watermark(NOW, SLACK)


def test_publication_is_monotonic() -> None:
    first = advance(None, Watermark(100, 200))
    assert first == Watermark(100, 200)
    # A new partition with old data lowers the estimate; the watermark holds, per component.
    assert advance(first, Watermark(50, 300)) == Watermark(100, 300)
    assert advance(Watermark(100, 300), Watermark(400, 100)) == Watermark(400, 300)


def test_caught_up_partition_with_a_recent_record_takes_its_times() -> None:
    recent = Watermark(NOW - 300, NOW - 200)  # event, system of the last record below the end
    assert partition_watermark(PartitionProgress(None, recent), NOW, SLACK) == recent
    assert caught_up_watermark(recent, NOW, SLACK) == recent


def test_quiet_partition_falls_back_to_the_idle_bound() -> None:
    old = Watermark(NOW - 60_000, NOW - 60_000)
    assert partition_watermark(PartitionProgress(None, old), NOW, SLACK) == idle_watermark(
        NOW, SLACK
    )
    assert caught_up_watermark(None, NOW, SLACK) == idle_watermark(NOW, SLACK)
    # Per component: a recent event time with an old Kafka timestamp (an extractor's time).
    mixed = Watermark(NOW - 100, NOW - 60_000)
    assert caught_up_watermark(mixed, NOW, SLACK) == Watermark(NOW - 100, NOW - SLACK)


def test_a_last_record_ahead_of_the_clock_counts_as_now() -> None:
    ahead = Watermark(NOW + 3_600_000, NOW + 50)
    assert caught_up_watermark(ahead, NOW, SLACK) == Watermark(NOW, NOW)


def test_lagging_partition_ignores_its_last_record() -> None:
    progress = PartitionProgress(Watermark(1_000, 1_500), Watermark(NOW, NOW))
    assert progress.has_lag
    assert partition_watermark(progress, NOW, SLACK) == Watermark(1_000, 1_500)


def test_minimum_over_caught_up_lagging_and_quiet_partitions() -> None:
    parts = [
        PartitionProgress(None, Watermark(NOW - 100, NOW - 90)),  # caught up, fresh
        PartitionProgress(None, Watermark(NOW - 900, NOW - 800)),  # caught up, less fresh
        PartitionProgress(None, Watermark(NOW - 90_000, NOW - 90_000)),  # quiet: idle bound
    ]
    assert injector_watermark(parts, NOW, SLACK) == idle_watermark(NOW, SLACK)
    assert injector_watermark(parts[:2], NOW, SLACK) == Watermark(NOW - 900, NOW - 800)
    lagging = PartitionProgress(Watermark(NOW - 5_000, NOW - 4_000))
    assert injector_watermark([*parts[:2], lagging], NOW, SLACK) == Watermark(
        NOW - 5_000, NOW - 4_000
    )


def test_caught_up_estimate_published_monotonically() -> None:
    first = advance(None, caught_up_watermark(Watermark(NOW - 100, NOW - 100), NOW, SLACK))
    # The next batch's last record is older (out of order, within the bound): the watermark
    # holds, it does not go back.
    second = caught_up_watermark(Watermark(NOW - 400, NOW + 5), NOW + 10, SLACK)
    assert advance(first, second) == Watermark(NOW - 100, NOW + 5)


def test_outage_hold_holds_the_data_implied_estimate_too() -> None:
    hold = OutageHold(grace_ms=15_000)
    hold.observe(NOW, NOW + 30_000, failed=True)  # down from NOW
    hold.observe(NOW + 30_000, NOW + 30_002)  # answered again at +30 s
    # A producer that reconnected first wrote a fresh record; others still hold older ones.
    fresh = caught_up_watermark(Watermark(NOW + 30_001, NOW + 30_001), NOW + 30_010, SLACK)
    assert fresh == Watermark(NOW + 30_001, NOW + 30_001)
    held = Watermark(NOW - SLACK, NOW - SLACK)
    assert hold.cap(fresh, NOW + 30_010, SLACK) == held
    assert hold.cap(fresh, NOW + 46_000, SLACK) == fresh  # grace over


def test_outage_hold_keeps_the_idle_bound_at_the_outage_start_through_the_grace() -> None:
    hold = OutageHold(grace_ms=15_000)
    idle = idle_watermark(NOW, SLACK)
    hold.observe(NOW - 10, NOW - 8)  # a healthy probe: nothing held
    assert hold.cap(idle, NOW, SLACK) == idle
    hold.observe(NOW, NOW + 30_000, failed=True)  # the broker is down
    hold.observe(NOW + 30_000, NOW + 36_000)  # slow, answered: back at +36 s
    held = Watermark(NOW - SLACK, NOW - SLACK)
    assert hold.cap(idle_watermark(NOW + 40_000, SLACK), NOW + 40_000, SLACK) == held
    assert hold.cap(Watermark(NOW - 5_000, NOW), NOW + 40_000, SLACK) == Watermark(
        NOW - 5_000, NOW - SLACK
    )  # lower estimates pass through
    assert hold.cap(idle, NOW + 51_000, SLACK) == held  # +36 s + 15 s grace: still held
    later = idle_watermark(NOW + 52_000, SLACK)
    assert hold.cap(later, NOW + 52_000, SLACK) == later  # grace over
    assert hold.started is None


def test_outage_hold_second_outage_within_grace_keeps_the_first_start() -> None:
    hold = OutageHold(grace_ms=15_000)
    hold.observe(NOW, NOW + 6_000)  # slow: an outage, answered at +6 s
    hold.observe(NOW + 10_000, NOW + 20_000, failed=True)
    hold.observe(NOW + 20_000, NOW + 20_003)  # fast: recovered at +20 s
    bound = NOW - SLACK
    assert hold.cap(idle_watermark(NOW + 34_000, SLACK), NOW + 34_000, SLACK).event == bound


def test_outage_hold_ignores_an_escalating_probe_and_can_be_disabled() -> None:
    hold = OutageHold(grace_ms=15_000)
    hold.observe(NOW, NOW + 3_100)  # one fetch-wait escalation: about 3 s
    assert hold.started is None
    off = OutageHold(grace_ms=0)
    off.observe(NOW, NOW + 60_000, failed=True)
    assert off.cap(idle_watermark(NOW, SLACK), NOW, SLACK) == idle_watermark(NOW, SLACK)


def test_broker_watch_marks_an_outage_from_the_last_answered_heartbeat() -> None:
    up = [False]

    def ping() -> None:
        if not up[0]:
            raise ConnectionError("broker down")

    hold = OutageHold(grace_ms=15_000)
    watch = BrokerWatch(hold, ping)
    watch.beat()  # never seen up: no outage to speak of (a broker that is not there yet)
    assert hold.started is None
    up[0] = True
    watch.beat()
    last_up = now_ms()
    assert hold.started is None
    up[0] = False
    watch.beat()
    assert hold.started is not None and hold.started <= last_up and hold.recovered is None
    up[0] = True
    watch.beat()
    assert hold.recovered is not None and hold.recovered >= hold.started


# ---------------------------------------------------------------- offsets and admission


def test_offset_json_round_trip_is_stable() -> None:
    offset = InjectorOffset({("b", 1): 7, ("a", 0): 3}, Watermark(-5, 9), 42)
    raw = offset.to_json()
    assert raw == {"p": {"a:0": 3, "b:1": 7}, "wm": [-5, 9], "tick": 42}
    assert InjectorOffset.from_json(raw) == offset
    assert parse_tp(tp_key(("my.topic-x", 12))) == ("my.topic-x", 12)


def test_foreign_offset_is_rejected_with_a_fix() -> None:
    with pytest.raises(ValueError, match="new checkpoint"):
        InjectorOffset.from_json({"offset": 3})


def test_allocate_is_max_min_fair_and_bounded() -> None:
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    assert allocate({a: 5, b: 100, c: 100}, 45) == {a: 5, b: 20, c: 20}
    assert allocate({a: 5, b: 100}, None) == {a: 5, b: 100}
    assert allocate({a: 0, b: 3}, 10) == {a: 0, b: 3}
    small = allocate({a: 10, b: 10, c: 10}, 2)
    assert sum(small.values()) == 2 and max(small.values()) == 1
    assert sum(allocate({a: 7, b: 1_000, c: 3}, 500).values()) == 500


def test_derived_id_is_compact_stable_and_distinct() -> None:
    one = derived_id("orders", 3, 17)
    assert len(one) == 16 and one == derived_id("orders", 3, 17)
    assert len({one, derived_id("orders", 3, 18), derived_id("orders", 4, 17)}) == 3
    assert derived_id("refunds", 3, 17) != one


# ---------------------------------------------------------------- the planner


class LogProbe:
    """In-memory partitions: `log[tp]` is a list of (offset, timestamp) records."""

    def __init__(self, log: dict[tuple[str, int], list[tuple[int, int]]]) -> None:
        self.log = log
        self.probes: list[dict[tuple[str, int], int]] = []
        self.lasts: list[dict[tuple[str, int], int]] = []
        self.brings_last = False  # the probe's fetch also holds the record at high - 1

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self.log)

    def probe(
        self, at: Mapping[tuple[str, int], int], drain: bool = False
    ) -> dict[tuple[str, int], Peek]:
        self.probes.append(dict(at))
        out = {}
        for tp, offset in at.items():
            records = self.log[tp]
            high = records[-1][0] + 1 if records else 0
            start = 0 if offset == EARLIEST else offset
            nxt = next(((o, ts) for o, ts in records if o >= start), None)
            if nxt is None:
                out[tp] = Peek(high=max(high, start), offset=None)
            else:
                o, ts = records[-1]
                last = Peek(high=high, offset=o, timestamp=ts, key=b"k", value=b"v")
                out[tp] = Peek(
                    high=high,
                    offset=nxt[0],
                    timestamp=nxt[1],
                    key=b"k",
                    value=b"v",
                    last=last if self.brings_last else None,
                )
        return out

    def last_records(self, ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], Peek]:
        self.lasts.append(dict(ends))
        out = {}
        for tp, end in ends.items():
            records = self.log[tp]
            high = records[-1][0] + 1 if records else 0
            below = [(o, ts) for o, ts in records if o < end]
            if not below:
                out[tp] = Peek(high=max(high, end), offset=None)
            else:
                o, ts = below[-1]
                out[tp] = Peek(high=high, offset=o, timestamp=ts, key=b"k", value=b"v")
        return out

    def close(self) -> None:
        pass


def planner(log: LogProbe, **options: str) -> OffsetPlanner:
    parsed = KafkaInjectorOptions.parse(
        {"bootstrap.servers": "localhost:9092", "topics": "t", "idleSlackMs": "2000"} | options
    )
    return OffsetPlanner(parsed, probe=log)  # type: ignore[arg-type]


def test_planner_watermark_is_the_record_at_the_end_offset_while_lagging() -> None:
    log = LogProbe({("t", 0): [(i, 1_000 + i) for i in range(10)], ("t", 1): []})
    plan = planner(log)
    start = plan.initial()
    assert start.positions == {("t", 0): 0, ("t", 1): 0}
    assert start.watermark.event == 1_000  # the first unread record

    end = plan.latest(start, limit=4)
    assert end is not None and end.positions[("t", 0)] == 4
    # Partition 1 is idle (now - slack, far above), partition 0 waits at offset 4.
    assert end.watermark == Watermark(1_004, 1_004)

    last = plan.latest(end, limit=None)
    assert last is not None and last.positions[("t", 0)] == 10
    assert last.watermark.event > 1_000_000_000_000  # caught up everywhere: the clock


def test_planner_without_news_waits_for_the_next_tick() -> None:
    log = LogProbe({("t", 0): [(0, 5)]})
    plan = planner(log, tickMs="3600000")
    start = plan.initial()
    end = plan.latest(start, limit=None)
    assert end is not None and end.positions == {("t", 0): 1}
    # Same positions, same tick: no batch.
    assert plan.latest(end, limit=None) is None
    # A new tick: an empty batch whose watermark moved with the clock.
    earlier_tick = InjectorOffset(end.positions, end.watermark, end.tick - 1)
    empty = plan.latest(earlier_tick, limit=None)
    assert empty is not None and empty.positions == end.positions
    assert empty.tick == end.tick and empty.watermark.event >= end.watermark.event


def test_planner_available_now_stops_at_the_frozen_ends() -> None:
    log = LogProbe({("t", 0): [(i, i) for i in range(5)]})
    plan = planner(log)
    start = plan.initial()
    plan.freeze_targets()
    log.log[("t", 0)].extend((i, i) for i in range(5, 8))  # arrives after the run started
    end = plan.latest(start, limit=None)
    assert end is not None and end.positions == {("t", 0): 5}
    assert end.watermark.event == 5  # the next record exists: lag, not idle
    assert plan.latest(end, limit=None) is None  # even on a new tick: the run is over


def test_planner_new_partition_joins_at_its_first_record() -> None:
    log = LogProbe({("t", 0): [(0, 100)]})
    plan = planner(log)
    start = plan.initial()
    plan._probe.log[("t", 1)] = [(3, 50), (4, 60)]  # type: ignore[attr-defined]
    end = plan.latest(start, limit=None)
    assert end is not None and end.positions == {("t", 0): 1, ("t", 1): 3}
    # The new partition's first record is older than anything seen: the watermark holds.
    assert end.watermark == start.watermark.max(Watermark(50, 50))


def test_partitions_are_one_task_per_partition_with_records() -> None:
    options = KafkaInjectorOptions.parse({"bootstrap.servers": "localhost:9092", "topics": "t"})
    reader = KafkaStreamReader(options)
    start = {"p": {"t:0": 5, "t:1": 9}, "wm": [0, 0], "tick": 1}
    end = {"p": {"t:0": 8, "t:1": 9, "t:2": 4}, "wm": [0, 0], "tick": 2}
    # t:1 has nothing new; t:2 just appeared and joins at 4 without a range to read.
    assert reader.partitions(start, end) == [KafkaRange("t", 0, 5, 8)]
    assert reader.partitions(end, end) == []


class FlakyLogProbe(LogProbe):
    """A LogProbe whose broker can be down: probes then fail as PartitionProbe's do."""

    down = False

    def probe(
        self, at: Mapping[tuple[str, int], int], drain: bool = False
    ) -> dict[tuple[str, int], Peek]:
        if self.down:
            raise TransientError("Kafka sent no fetch response (test: broker down)")
        return super().probe(at, drain)

    def last_records(self, ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], Peek]:
        if self.down:
            raise TransientError("Kafka sent no fetch response (test: broker down)")
        return super().last_records(ends)


@pytest.mark.parametrize("grace", ["15000", "0"])
def test_records_held_by_producers_during_an_outage_are_not_late(grace: str) -> None:
    # A producer's record created just before the broker went down is delivered after it came
    # back, with its creation time: with the hold it is ahead of every watermark published in
    # between; without it (grace 0) the idle policy had already passed it.
    log = FlakyLogProbe({("t", 0): [(0, now_ms())]})
    plan = planner(log, outageGraceMs=grace, idleSlackMs="50")
    caught_up = plan.latest(plan.initial(), limit=None)
    assert caught_up is not None
    created = now_ms()  # the producer creates the record; the broker dies before it lands
    log.down = True
    with pytest.raises(TransientError):
        plan.latest(caught_up, limit=None)
    time.sleep(0.1)  # the outage lasts longer than the idle slack
    log.down = False
    back = plan.latest(InjectorOffset(caught_up.positions, caught_up.watermark, 0), limit=None)
    assert back is not None
    log.log[("t", 0)].append((1, created))  # the producer's retry lands
    late = back.watermark.event > created
    assert late == (grace == "0"), (back.watermark, created)


def test_planner_caught_up_watermark_is_the_newest_record_not_the_idle_bound() -> None:
    t = now_ms()
    log = LogProbe({("t", 0): [(0, t - 300), (1, t - 200), (2, t - 100)], ("t", 1): [(0, t - 150)]})
    plan = planner(log, idleSlackMs="60000")
    end = plan.latest(plan.initial(), limit=None)
    assert end is not None and end.positions == {("t", 0): 3, ("t", 1): 1}
    # Both caught up: each partition's newest record, minimum over partitions.
    assert end.watermark == Watermark(t - 150, t - 150)
    assert log.lasts == [{("t", 0): 3, ("t", 1): 1}]

    # No news on a new tick: the same ends, the same records, no probe for them.
    again = plan.latest(InjectorOffset(end.positions, end.watermark, end.tick - 1), limit=None)
    assert again is not None and again.watermark == end.watermark and len(log.lasts) == 1

    # One new record each: step 1's peek already is the last record below the new end.
    log.log[("t", 0)].append((3, t - 50))
    log.log[("t", 1)].append((1, t - 20))
    one = plan.latest(end, limit=None)
    assert one is not None and one.watermark == Watermark(t - 50, t - 50)
    assert len(log.lasts) == 1
    # Several new records, of which the probe's fetch brought only the first (it stopped short
    # of the high watermark): the batch ends after that record, its times are the estimate,
    # and no second probe runs; the rest is the next batch's.
    log.log[("t", 0)].extend([(4, t - 40), (5, t - 10)])
    short = plan.latest(one, limit=None)
    assert short is not None and short.positions == {("t", 0): 5, ("t", 1): 2}
    assert short.watermark == Watermark(t - 40, t - 40)
    assert len(log.lasts) == 1
    # Nothing newer: the next batch reads the record left over and ends at the high watermark
    # the last probe saw, whose last record takes the one probe.
    rest = plan.latest(short, limit=None)
    assert rest is not None and rest.positions == {("t", 0): 6, ("t", 1): 2}
    assert rest.watermark == Watermark(t - 20, t - 20)
    assert log.lasts[-1] == {("t", 0): 6}
    # Several new records that came in the probe's own fetch (`Peek.last`): no second probe,
    # the same estimate as from it.
    log.brings_last = True
    log.log[("t", 0)].extend([(6, t - 8), (7, t - 5)])
    log.log[("t", 1)].extend([(2, t - 9), (3, t - 6)])
    brought = plan.latest(rest, limit=None)
    assert brought is not None and brought.positions == {("t", 0): 8, ("t", 1): 4}
    assert brought.watermark == Watermark(t - 6, t - 6)
    assert len(log.lasts) == 2


def test_a_fetch_short_of_its_high_watermark_ends_the_batch_at_its_newest_record() -> None:
    # The fetch brought offsets 3..5 of 3..8 (the embedded broker reads the high watermark
    # after the records): the batch ends at 6 with record 5's times, no second probe.
    t = now_ms()
    log = ShortFetchProbe(
        {("t", 0): [(i, t - 100 + i) for i in range(9)], ("t", 1): [(0, t - 20), (1, t - 10)]},
        brought=3,
    )
    plan = planner(log, idleSlackMs="60000")
    start = InjectorOffset({("t", 0): 3, ("t", 1): 0}, Watermark(0, 0), 0)
    plan._known_high = {("t", 0): 3, ("t", 1): 0}
    end = plan.latest(start, limit=None)
    assert end is not None and end.positions == {("t", 0): 6, ("t", 1): 2}
    assert end.watermark == Watermark(t - 95, t - 95)  # record 5's: partition 0 is the minimum
    assert log.lasts == []
    # A backlog beyond what one fetch brings (3 of 3..19, its byte limit) is read whole: the
    # end stays at the high watermark and its last record takes the second probe.
    log.log[("t", 0)] = [(i, t - 100 + i) for i in range(20)]
    backlog = planner(log, idleSlackMs="60000")
    backlog._known_high = {("t", 0): 3, ("t", 1): 0}
    whole = backlog.latest(start, limit=None)
    assert whole is not None and whole.positions == {("t", 0): 20, ("t", 1): 2}
    assert whole.watermark == Watermark(t - 81, t - 81)  # record 19's
    assert log.lasts == [{("t", 0): 20}]


def test_records_left_after_a_short_fetch_are_pending_however_old() -> None:
    # A restart over ten minutes of records: the fetch at the checkpoint's position stopped
    # short of its high watermark below its byte limit (a log segment's end on Apache Kafka).
    # The records after the cut are in the log and unread: the estimate is the newest record
    # brought, not the idle bound now - 2 s, which would make the rest of the backlog late.
    t = now_ms()
    old = [(i, t - 600_000 + i) for i in range(9)]
    log = ShortFetchProbe({("t", 0): old}, brought=5)
    plan = planner(log)  # idleSlackMs=2000
    start = InjectorOffset({("t", 0): 0}, Watermark(0, 0), 0)
    end = plan.latest(start, limit=None)
    assert end is not None and end.positions == {("t", 0): 5}
    assert end.watermark == Watermark(t - 600_000 + 4, t - 600_000 + 4)
    rest = plan.latest(end, limit=None)  # the next fetch reaches the end: caught up
    assert rest is not None and rest.positions == {("t", 0): 9}
    assert end.watermark.event <= min(ts for o, ts in old if o >= 5)  # none of them late


def test_a_partition_about_to_catch_up_whose_fetch_stops_short_keeps_its_records_on_time() -> None:
    # As below, but partition 1's fetch brings only its first new record: the batch ends after
    # it, and the estimate stays at or below the record left for the next batch.
    log = LogProbe({("t", 0): [(i, 1_000 + i) for i in range(100)], ("t", 1): [(0, 2_000)]})
    plan = planner(log)
    first = plan.latest(plan.initial(), limit=20)
    assert first is not None and first.positions == {("t", 0): 19, ("t", 1): 1}
    log.log[("t", 1)] += [(1, 1_025), (2, 1_026)]
    second = plan.latest(first, limit=20)
    assert second is not None and second.positions == {("t", 0): 37, ("t", 1): 2}
    assert second.watermark == Watermark(1_025, 1_025)
    third = plan.latest(second, limit=20)
    assert third is not None and third.positions[("t", 1)] == 3  # 1,026: read, on time


class ShortFetchProbe(LogProbe):
    """A LogProbe whose fetch brings at most `brought` records of each partition; it stops at
    its byte limit (`Peek.full`) when more than that many records were left out."""

    def __init__(self, log: dict[tuple[str, int], list[tuple[int, int]]], brought: int) -> None:
        super().__init__(log)
        self.brought = brought

    def probe(
        self, at: Mapping[tuple[str, int], int], drain: bool = False
    ) -> dict[tuple[str, int], Peek]:
        out = {}
        for tp, peek in super().probe(at, drain).items():
            if peek.offset is not None:
                o = min(peek.offset + self.brought - 1, peek.high - 1)
                ts = dict(self.log[tp])[o]
                newest = Peek(high=peek.high, offset=o, timestamp=ts, key=b"k", value=b"v")
                full = peek.high - 1 - o > self.brought
                peek = dataclasses.replace(peek, last=newest, full=full)
            out[tp] = peek
        return out


def test_planner_quiet_partition_and_timestamp_extractor() -> None:
    t = now_ms()
    log = LogProbe({("t", 0): [(0, t - 100)], ("t", 1): [(0, t - 600_000)]})
    plan = planner(log)  # idleSlackMs=2000
    end = plan.latest(plan.initial(), limit=None)
    assert end is not None
    # Partition 1 went quiet ten minutes ago: the idle bound, now - 2 s, holds the minimum.
    assert t - 2_000 <= end.watermark.event <= now_ms() - 2_000
    # With a timestampExtractor: the last record's event time from it, its system time from
    # the Kafka timestamp.
    EXTRACTED[0] = t - 600
    ext = planner(
        LogProbe({("t", 0): [(0, t - 100)]}),
        idleSlackMs="60000",
        timestampExtractor="tests.unit.test_injector_watermark:extracted_event_time",
    )
    caught = ext.latest(ext.initial(), limit=None)
    assert caught is not None and caught.watermark == Watermark(t - 600, t - 100)


EXTRACTED = [0]


def extracted_event_time(key: bytes | None, value: bytes | None, headers: object) -> int:
    """A timestampExtractor for the test above: the event time it was told."""
    return EXTRACTED[0]


@pytest.mark.parametrize("bound", [300, 1_000])
def test_record_inside_the_out_of_order_bound_is_on_time_with_the_new_estimate(
    bound: int,
) -> None:
    # Records reach one partition out of order by less than the stream's bound, one batch per
    # record. The runtime judges lateness against the published estimate less the bound
    # (connectors' `less_bound`): every record must be at or after it, while the estimate
    # follows the data (far above now - idle slack) rather than the clock.
    rng = random.Random(3)
    t = now_ms()
    times = [t - 5_000 + 10 * i - rng.randrange(bound) for i in range(200)]
    log = LogProbe({("t", 0): []})
    plan = planner(log, idleSlackMs="60000")
    offset = plan.initial()
    followed_data = 0
    for i, ts in enumerate(times):
        runtime_watermark = offset.watermark.event - bound  # what `less_bound` makes of it
        assert ts >= runtime_watermark, (i, ts, runtime_watermark)
        log.log[("t", 0)].append((i, ts))
        nxt = plan.latest(offset, limit=None)
        assert nxt is not None
        assert nxt.watermark.event >= offset.watermark.event  # monotonic
        followed_data += nxt.watermark.event == max(times[: i + 1])
        offset = nxt
    assert followed_data == len(times)


@pytest.mark.parametrize("grace", ["15000", "0"])
def test_a_fresh_record_after_an_outage_does_not_make_held_records_late(grace: str) -> None:
    # Two producers: one reconnects first and writes a fresh record; the other then delivers
    # the record it held through the outage. With the hold, the data-implied estimate of the
    # fresh record is held too; without it (grace 0) the held record is late.
    log = FlakyLogProbe({("t", 0): [(0, now_ms())]})
    plan = planner(log, outageGraceMs=grace, idleSlackMs="50")
    caught_up = plan.latest(plan.initial(), limit=None)
    assert caught_up is not None
    created = now_ms()
    log.down = True
    with pytest.raises(TransientError):
        plan.latest(caught_up, limit=None)
    time.sleep(0.1)
    log.down = False
    log.log[("t", 0)].append((1, now_ms()))  # the first producer back: a fresh record
    back = plan.latest(caught_up, limit=None)
    assert back is not None
    log.log[("t", 0)].append((2, created))  # the other producer's held record lands
    late = back.watermark.event > created
    assert late == (grace == "0"), (back.watermark, created)


def test_the_reader_keeps_its_outage_hold_when_a_probe_fails() -> None:
    # The query's trigger meets the outage: latestOffset answers "no new batch" and renews the
    # probe's client, but keeps the planner whose hold covers the records producers held back
    # (it used to drop the planner, and with it the hold: those records came in late).
    log = FlakyLogProbe({("t", 0): [(0, now_ms())]})
    plan = planner(log, outageGraceMs="15000", idleSlackMs="50")
    reader = KafkaStreamReader(plan._options)
    reader._planner = plan
    closed: list[bool] = []
    log.close = lambda: closed.append(True)  # type: ignore[method-assign]
    caught_up = reader.latestOffset(plan.initial().to_json(), ReadAllAvailable())
    created = now_ms()
    log.down = True
    assert reader.latestOffset(caught_up, ReadAllAvailable()) == caught_up  # no batch
    assert reader._planner is plan and closed == [True]  # same planner, fresh client
    time.sleep(0.1)
    log.down = False
    log.log[("t", 0)].append((1, now_ms()))  # a producer back first: a fresh record
    back = InjectorOffset.from_json(reader.latestOffset(caught_up, ReadAllAvailable()))
    assert back.watermark.event <= created, (back.watermark, created)  # the held one is on time


# ---------------------------------------------------------------- probing ahead of a backlog


def _ahead_done(plan: OffsetPlanner) -> dict[tuple[str, int], int] | None:
    """Where the probe started ahead looked, once it is over (None: none started)."""
    ahead = plan._ahead
    if ahead is None:
        return None
    ahead.future.result(timeout=10)
    return ahead.at


def test_a_backlog_probes_the_next_batchs_ends_while_the_batch_runs() -> None:
    log = LogProbe({("t", p): [(i, 1_000 * p + i) for i in range(100)] for p in (0, 1)})
    plan = planner(log)
    first = plan.latest(plan.initial(), limit=20)
    assert first is not None and first.positions == {("t", 0): 10, ("t", 1): 10}
    assert _ahead_done(plan) == {("t", 0): 20, ("t", 1): 20}  # the next batch's ends
    probes = len(log.probes)
    second = plan.latest(first, limit=20)
    assert second is not None and second.positions == {("t", 0): 20, ("t", 1): 20}
    assert len(log.probes) == probes  # this trigger asked the broker nothing
    # The same watermark as a probe at the trigger: the oldest next unread record.
    assert second.watermark == Watermark(20, 20)
    assert _ahead_done(plan) == {("t", 0): 30, ("t", 1): 30}


def test_a_probe_ahead_for_other_offsets_is_not_used() -> None:
    log = LogProbe({("t", 0): [(i, i) for i in range(100)]})
    plan = planner(log)
    first = plan.latest(plan.initial(), limit=20)
    assert first is not None and _ahead_done(plan) == {("t", 0): 40}
    # Spark asks from elsewhere (say a restarted query, from its checkpoint): a fresh probe.
    other = InjectorOffset({("t", 0): 50}, first.watermark, first.tick)
    end = plan.latest(other, limit=20)
    assert end is not None and end.positions == {("t", 0): 70}
    assert log.probes[-1] == {("t", 0): 70} and end.watermark == Watermark(70, 70)


def test_a_failed_probe_ahead_gives_way_to_a_fresh_one() -> None:
    class AheadFails(LogProbe):
        def probe(
            self, at: Mapping[tuple[str, int], int], drain: bool = False
        ) -> dict[tuple[str, int], Peek]:
            if threading.current_thread().name.startswith("millstream-probe-ahead"):
                raise TransientError("Kafka sent no fetch response (test)")
            return super().probe(at, drain)

    log = AheadFails({("t", 0): [(i, i) for i in range(100)]})
    plan = planner(log)
    first = plan.latest(plan.initial(), limit=20)
    assert first is not None and plan._ahead is not None
    with pytest.raises(TransientError):
        plan._ahead.future.result(timeout=10)
    second = plan.latest(first, limit=20)
    assert second is not None and second.watermark == Watermark(40, 40)
    assert log.probes[-1] == {("t", 0): 40}


def test_a_partition_about_to_catch_up_is_judged_against_fresh_high_watermarks() -> None:
    # Partition 1 drains in the first batch; then records arrive in it, older than partition
    # 0's backlog. Against the high watermark of the last probe (stale) partition 1 looked
    # caught up: its records were left for a later batch, and this batch's watermark (the
    # clock's for partition 1, partition 0's next record) passed them: late.
    log = LogProbe({("t", 0): [(i, 1_000 + i) for i in range(100)], ("t", 1): [(0, 2_000)]})
    log.brings_last = True  # each fetch reaches its high watermark
    plan = planner(log)
    first = plan.latest(plan.initial(), limit=20)
    assert first is not None and first.positions == {("t", 0): 19, ("t", 1): 1}
    assert first.watermark == Watermark(1_019, 1_019)
    log.log[("t", 1)] += [(1, 1_025), (2, 1_026)]
    second = plan.latest(first, limit=20)
    # Read in this batch, whose records meet the watermark 1,019: on time.
    assert second is not None and second.positions == {("t", 0): 37, ("t", 1): 3}
    assert second.watermark == Watermark(1_037, 1_037)


def test_closing_does_not_wait_for_a_probe_ahead_that_hangs() -> None:
    release = threading.Event()

    class AheadHangs(LogProbe):
        closed = False

        def probe(
            self, at: Mapping[tuple[str, int], int], drain: bool = False
        ) -> dict[tuple[str, int], Peek]:
            if threading.current_thread().name.startswith("millstream-probe-ahead"):
                release.wait(10)  # a broker that went quiet: up to the probe's timeout
            return super().probe(at, drain)

        def close(self) -> None:
            self.closed = True

    log = AheadHangs({("t", 0): [(i, i) for i in range(100)]})
    plan = planner(log)
    assert plan.latest(plan.initial(), limit=20) is not None and plan._ahead is not None
    began = time.monotonic()
    plan.close()
    assert time.monotonic() - began < 1.0 and not log.closed  # its client stays with it
    release.set()
