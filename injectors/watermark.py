"""Injector low-watermark estimation (docs/design.md section 8): pure functions, no I/O.

An injector cannot know the event times of records not yet written, so its watermark is an
estimate. Per partition:

* while the partition has lag at the batch's end offset, the next unread record is the oldest
  pending work, so its time is the estimate (for a batch the planner ended early, after the
  newest record its probe brought, that record's time stands in: see `PartitionProgress`);
* once caught up, the estimate is the newer of what the partition's data implies and the idle
  bound. The data: the times of the last record below the end offset (the newest the
  partition holds; `PartitionProgress.last_record`). Records still to come may be older than
  it only by the stream's out-of-order bound (`max_out_of_order_ms`), which the runtime
  subtracts from the whole stream's estimate afterwards (`connectors.batch_watermarks.
  BatchWatermarks.less_bound`), so it is not subtracted here. The idle bound: nothing older
  than `now - idle_slack_ms` will still arrive. So a window closes as soon as a later record
  reached every partition (as Quix Streams closes it), and the idle slack only matters once a
  partition has really gone quiet. The data-implied part never passes `now`: a record stamped
  ahead of this clock (a skewed producer) must not make every other producer's records late.

The injector's watermark is the minimum over its partitions, and a published watermark never
goes back.

Event time and system time follow the same rule: event time from the record's event
timestamp (or the user's timestamp extractor), system time from the Kafka record timestamp.

The estimate is wrong right after the broker was unreachable: producers kept what they could
not send and deliver it once the broker is back, with the timestamps of when it was produced.
So after an outage (`OutageHold`) the estimate stays at the outage's start minus the slack
until a grace period after the broker answered again. That holds the data-implied part too:
producers reconnect one after another (each within its own reconnect backoff), so a fresh
record from the first one back says nothing about what the others still hold.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from millstream.state.watermarks import Watermark


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition as seen at a batch's end offset.

    `next_record` is the (event ms, system ms) of the first record at or after the end offset
    when the partition has lag, and None when the end offset is the partition's end. A batch
    the planner ended after the newest record its probe's fetch brought, short of the high
    watermark, has lag: that record's times stand in for the next one's (`_kafka_plan._cut`).
    `last_record` (caught up only) is the (event ms, system ms) of the last record below the end
    offset, None when unknown (no record there, no usable timestamp): then only the idle bound.
    """

    next_record: Watermark | None
    last_record: Watermark | None = None

    @property
    def has_lag(self) -> bool:
        return self.next_record is not None


def idle_watermark(now_ms: int, idle_slack_ms: int) -> Watermark:
    """The idle policy: a caught-up partition expects nothing older than now minus the slack."""
    bound = now_ms - idle_slack_ms
    return Watermark(bound, bound)


def caught_up_watermark(
    last_record: Watermark | None, now_ms: int, idle_slack_ms: int
) -> Watermark:
    """A caught-up partition: per component, the newer of its last record's times (never past
    `now_ms`) and the idle bound `now_ms - idle_slack_ms`."""
    idle = idle_watermark(now_ms, idle_slack_ms)
    if last_record is None:
        return idle
    return last_record.min(Watermark(now_ms, now_ms)).max(idle)


def partition_watermark(progress: PartitionProgress, now_ms: int, idle_slack_ms: int) -> Watermark:
    """Lag: the next unread record's times. Caught up: `caught_up_watermark`."""
    if progress.next_record is not None:
        return progress.next_record
    return caught_up_watermark(progress.last_record, now_ms, idle_slack_ms)


def injector_watermark(
    partitions: Iterable[PartitionProgress], now_ms: int, idle_slack_ms: int
) -> Watermark:
    """Minimum over partitions, per component; no partitions at all counts as idle."""
    out: Watermark | None = None
    for progress in partitions:
        value = partition_watermark(progress, now_ms, idle_slack_ms)
        out = value if out is None else out.min(value)
    return out if out is not None else idle_watermark(now_ms, idle_slack_ms)


def advance(previous: Watermark | None, estimate: Watermark) -> Watermark:
    """Monotonic: a new estimate below the previous one (a new partition with old data, a late
    record peeked after the idle bound passed it) holds the watermark where it was."""
    return estimate if previous is None else previous.max(estimate)


@dataclass
class OutageHold:
    """The planner's memory of a broker outage (see the module docstring).

    An outage starts with the first probe that failed or took longer than `slow_ms` (healthy
    probes take milliseconds; a probe that escalates its fetch wait takes about 3 s) and ends
    when a probe is answered. Until `grace_ms` after that (librdkafka producers reconnect within
    `reconnect.backoff.max.ms`, 10 s by default), no estimate passes `started -
    idle_slack_ms`, neither the idle bound nor a caught-up partition's last record: records the
    producers held during the outage are not made late by the broker's return, nor by a record
    a producer that reconnected sooner wrote. Another outage within the grace period extends the hold from the first
    start. `grace_ms=0` disables the hold.
    """

    grace_ms: int
    slow_ms: int = 5000
    started: int | None = None  # wall ms the first failed or slow probe began
    recovered: int | None = None  # wall ms the broker answered again
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, began: int, ended: int, *, failed: bool = False) -> None:
        """Record one probe: `began`/`ended` wall ms, `failed` if it raised."""
        with self._lock:
            self._observe(began, ended, failed)

    def _observe(self, began: int, ended: int, failed: bool) -> None:
        if failed or ended - began > self.slow_ms:
            if self.started is None:
                self.started = began
            self.recovered = None if failed else ended  # slow but answered: the broker is back
        elif self.started is not None and self.recovered is None:
            self.recovered = began

    def cap(self, estimate: Watermark, now: int, idle_slack_ms: int) -> Watermark:
        """`estimate`, held at the outage start minus the slack while the hold lasts."""
        with self._lock:
            return self._cap(estimate, now, idle_slack_ms)

    def _cap(self, estimate: Watermark, now: int, idle_slack_ms: int) -> Watermark:
        if self.grace_ms <= 0 or self.started is None:
            return estimate
        if self.recovered is not None and now > self.recovered + self.grace_ms:
            self.started = self.recovered = None  # the grace period is over
            return estimate
        bound = self.started - idle_slack_ms
        return estimate.min(Watermark(bound, bound))
