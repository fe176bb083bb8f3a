"""Injector low-watermark estimation (DESIGN.md section 6): pure functions, no I/O.

An injector cannot know the event times of records not yet written, so its watermark is an
estimate. Per partition: while the partition has lag, the next unread record is the oldest
pending work, so its time is the estimate; once caught up, the idle policy assumes nothing
older than `now - idle_slack_ms` will still arrive. The injector's watermark is the minimum
over its partitions, and a published watermark never goes back.

Event time and system time follow the same rule: event time from the record's event
timestamp (or the user's timestamp extractor), system time from the Kafka record timestamp.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from millstream.state.watermarks import Watermark


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition as seen at a batch's end offset.

    `next_record` is the (event ms, system ms) of the first record at or after the end offset
    when the partition has lag, and None when the end offset is the partition's end.
    """

    next_record: Watermark | None

    @property
    def has_lag(self) -> bool:
        return self.next_record is not None


def idle_watermark(now_ms: int, idle_slack_ms: int) -> Watermark:
    """The idle policy: a caught-up partition expects nothing older than now minus the slack."""
    bound = now_ms - idle_slack_ms
    return Watermark(bound, bound)


def partition_watermark(progress: PartitionProgress, now_ms: int, idle_slack_ms: int) -> Watermark:
    """Lag: the next unread record's times. Caught up: the idle policy."""
    if progress.next_record is not None:
        return progress.next_record
    return idle_watermark(now_ms, idle_slack_ms)


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
