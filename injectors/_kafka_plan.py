"""Driver side of the Kafka injector: choose each micro-batch's end offset and watermark.

Runs in Spark's planner process, which lives as long as the query, so the probe consumer, the
last known high watermarks and the last record's times per caught-up end offset are kept on
the planner between triggers.

While a backlog lasts, the next batch's end offsets are known when this batch's are: the same
admission control from this batch's ends over the same known high watermarks. So the next
batch's probe of the record at each of its ends (the watermark's, step 3 of `latest`) runs in a
thread while this batch runs, and the next trigger takes its answer when it asks for exactly
those offsets: one broker round trip less between two batches (130 ms of the 1.2 s between
batches measured in a throughput run here). A record at an offset does not change, so the
answer is the one a probe at the trigger would give. Staleness matters only for the high
watermarks, and a partition is judged caught up only against fresh ones (step 1).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from millstream.errors import ConfigurationError
from millstream.injectors._kafka_offsets import InjectorOffset, TopicPartition, allocate
from millstream.injectors._kafka_options import Extractor, KafkaInjectorOptions, load_extractor
from millstream.injectors._kafka_probe import EARLIEST, PartitionProbe, Peek
from millstream.injectors._kafka_watch import BrokerWatch, metadata_ping
from millstream.injectors.watermark import (
    OutageHold,
    PartitionProgress,
    advance,
    idle_watermark,
    injector_watermark,
)
from millstream.state.watermarks import NONE_KNOWN, Watermark, now_ms

log = logging.getLogger(__name__)

Probed = tuple[int, int, dict[TopicPartition, Peek]]  # began, ended (ms), the peeks


@dataclass
class _Ahead:
    """The next batch's step-3 probe, started while this batch runs."""

    at: dict[TopicPartition, int]
    future: Future[Probed]


class OffsetPlanner:
    """Plans [start, end) ranges: admission control, AvailableNow targets, watermark, tick."""

    def __init__(self, options: KafkaInjectorOptions, probe: PartitionProbe | None = None) -> None:
        self._options = options
        self._probe = probe or PartitionProbe(options)
        log.info("millstream-kafka planner for %s", options.describe())
        self._known_high: dict[TopicPartition, int] = {}
        # Per partition: an end offset it was caught up at, and its last record's times there
        # (None: no usable record). A function of the end offset (see `_kafka_probe`), so a
        # quiet partition is not probed again while its end stays where it is.
        self._last: dict[TopicPartition, tuple[int, Watermark | None]] = {}
        self._hold = OutageHold(options.outage_grace_ms)
        self._watch: BrokerWatch | None = None
        if probe is None and options.outage_grace_ms > 0:  # a real broker: watch it
            ping = metadata_ping(options)
            self._watch = BrokerWatch(self._hold, ping, name=options.stream).start()
        self._targets: dict[TopicPartition, int] | None = None
        self._ahead: _Ahead | None = None
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._ts_extractor: Extractor | None = None
        if options.timestamp_extractor:
            try:
                self._ts_extractor = load_extractor(
                    options.timestamp_extractor, "timestampExtractor"
                )
            except ConfigurationError as exc:
                # Validated when the source was created; files shipped with addPyFile may
                # not be importable in the planner process. Executors import it again, and
                # fail the query if they cannot; here it only refines the estimate.
                log.warning("watermark estimate uses Kafka timestamps: %s", exc)

    # ---------------------------------------------------------------- probing helpers

    def _probe_at(
        self, at: Mapping[TopicPartition, int], drain: bool = False
    ) -> dict[TopicPartition, Peek]:
        peeks = self._observed(lambda offsets: self._probe.probe(offsets, drain=drain), at)
        for tp, peek in peeks.items():
            self._known_high[tp] = peek.high
        return peeks

    def _timed_probe(self, at: Mapping[TopicPartition, int]) -> Probed:
        began = now_ms()
        peeks = self._probe.probe(at)
        return began, now_ms(), peeks

    def _backlog_ends(
        self, positions: Mapping[TopicPartition, int], limit: int | None
    ) -> dict[TopicPartition, int] | None:
        """The batch's ends from `positions` when the known high watermarks suffice (step 1
        skipped): a backlog beyond `limit` and every partition still lagging after admission
        control; None when a fresh probe of the high watermarks is needed. `latest` decides
        with it, and `_look_ahead` predicts the next trigger's decision with it."""
        if limit is None or self._targets is not None:
            return None
        if any(tp not in self._known_high for tp in positions):
            return None
        high = self._known_high
        if sum(max(0, high[tp] - pos) for tp, pos in positions.items()) < limit:
            return None
        ends = self._admit(positions, high, limit)
        return ends if all(e < high[tp] for tp, e in ends.items()) else None

    def _look_ahead(self, end: Mapping[TopicPartition, int], limit: int | None) -> None:
        """Start the next batch's step-3 probe if the next trigger, starting at `end`, will
        skip step 1 and ask for it (see the module docstring)."""
        at = self._backlog_ends(end, limit)
        if not at:
            return  # a fresh probe at the next trigger (or nothing to read)
        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="millstream-probe-ahead")
        self._ahead = _Ahead(at, self._ahead_pool.submit(self._timed_probe, at))

    def _take_ahead(self) -> tuple[dict[TopicPartition, int], Probed] | None:
        """The probe started ahead, once it is over (no probe runs beside another: every entry
        point takes it first); None if there was none or it failed (the fresh probe that
        replaces it reports the failure)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        try:
            return ahead.at, ahead.future.result()
        except Exception as exc:
            log.debug("probe ahead of the next batch failed: %s", exc)
            return None

    def _observed(
        self,
        call: Callable[[Mapping[TopicPartition, int]], dict[TopicPartition, Peek]],
        at: Mapping[TopicPartition, int],
    ) -> dict[TopicPartition, Peek]:
        """One probe, timed for the outage hold."""
        began = now_ms()
        try:
            peeks = call(at)
        except Exception:
            self._hold.observe(began, now_ms(), failed=True)
            raise
        self._hold.observe(began, now_ms())
        return peeks

    def _last_times(self, peek: Peek, now: int) -> Watermark | None:
        """(event, system) ms of a caught-up partition's last record, as the executors read it,
        or None where it says nothing: no record, a record the readers turn into an error row
        (no or a negative timestamp, one beyond maxFutureMs, a timestampExtractor that fails),
        or a timestampExtractor this process cannot load (Kafka timestamps are no stand-in for
        the event times it would give)."""
        if peek.offset is None or peek.timestamp is None or peek.timestamp < 0:
            return None
        system = peek.timestamp
        event = system
        if self._options.timestamp_extractor:
            if self._ts_extractor is None:
                return None
            try:
                value = self._ts_extractor(peek.key, peek.value, peek.headers or [])
            except Exception as exc:
                log.debug("timestampExtractor failed on a peeked record: %s", exc)
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                return None
            event = value
        if max(event, system) > now + self._options.max_future_ms:
            return None
        return Watermark(event, system)

    def _caught_up_records(
        self,
        ends: Mapping[TopicPartition, int],
        first: Mapping[TopicPartition, Peek],
        now: int,
    ) -> dict[TopicPartition, Watermark | None]:
        """The last record's times below each caught-up partition's end offset. Known without
        a fetch when the end did not move since the last batch, or when step 1's fetch brought
        the record at `end - 1` (as its first record, or among the messages it read after it:
        `Peek.last`); the rest in one probe."""
        out: dict[TopicPartition, Watermark | None] = {}
        need: dict[TopicPartition, int] = {}
        for tp, end in ends.items():
            cached = self._last.get(tp)
            peek = first.get(tp)
            if cached is not None and cached[0] == end:
                out[tp] = cached[1]
            elif peek is not None and peek.offset is not None and peek.offset == end - 1:
                out[tp] = self._last_times(peek, now)
            elif peek is not None and peek.last is not None and peek.last.offset == end - 1:
                out[tp] = self._last_times(peek.last, now)
            else:
                need[tp] = end
        if need:
            for tp, peek in self._observed(self._probe.last_records, need).items():
                out[tp] = self._last_times(peek, now)
        for tp, times in out.items():
            self._last[tp] = (ends[tp], times)
        return out

    @staticmethod
    def _cut(peek: Peek | None, position: int, end: int) -> Peek | None:
        """The newest record step 1's fetch brought, when that fetch stopped short of the high
        watermark `end` below its byte limit; None to end the batch at `end`.

        On the embedded broker a fetch's high watermark is read after its records (about 15%
        of probes at 1,000 events/s), and the record below it then cost a second fetch, 0.1-
        0.5 s of the trigger. Instead the batch ends after the newest record brought, and the
        partition counts as lagging with that record's times standing in for the next
        record's: the records after it, already in the log, were written after it, so they are
        older than it by at most the stream's out-of-order bound, which the runtime subtracts
        (`watermark`). The idle bound does not apply: those records are pending work, however
        old. A fetch at its byte limit (a backlog) is read whole instead, with the second
        fetch, so catch-up batches are not cut to one fetch's bytes."""
        if peek is None or peek.offset is None or peek.full:
            return None
        newest = peek.last if peek.last is not None else peek
        assert newest.offset is not None
        return newest if position <= newest.offset < end - 1 else None

    def _record_times(self, peek: Peek, now: int) -> Watermark | None:
        """(event, system) ms of a peeked record; None when the peek found no record."""
        if peek.offset is None:
            return None
        system = peek.timestamp
        if system is None:  # a record without timestamp (message format v0): assume "now"
            system = idle_watermark(now, self._options.idle_slack_ms).system
        event = system
        if self._ts_extractor is not None:
            try:
                value = self._ts_extractor(peek.key, peek.value, peek.headers or [])
                if isinstance(value, int) and not isinstance(value, bool):
                    event = value
            except Exception as exc:  # the executor turns this record into an error row
                log.debug("timestampExtractor failed on a peeked record: %s", exc)
        if max(event, system) > now + self._options.max_future_ms:
            # A record far ahead of the clock is dead-lettered, not processed: it says nothing
            # about pending work, and as the estimate it would push the (monotonic) watermark
            # years ahead and make every later record late. Hold the watermark instead.
            return NONE_KNOWN
        return Watermark(event, system)

    # ---------------------------------------------------------------- Spark entry points

    def initial(self) -> InjectorOffset:
        """Starting positions: the first record of each partition, or each partition's end.

        Spark asks again when a query restarts before its first batch committed, and reads that
        batch from the new answer to the end it logged: from `latest` (or after retention) a
        new answer would skip the batch's records. With `startFile` the first answer is kept
        and given again, as Spark's own Kafka source keeps its in the checkpoint."""
        self._take_ahead()
        kept = self._kept_start()
        if kept is not None:
            return kept
        start = self._first_start()
        if self._options.start_file:
            path = Path(self._options.start_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(start.to_json()))
            os.replace(temporary, path)  # atomic: a restart finds no file or a whole one
        return start

    def _kept_start(self) -> InjectorOffset | None:
        if not self._options.start_file:
            return None
        try:
            return InjectorOffset.from_json(json.loads(Path(self._options.start_file).read_text()))
        except FileNotFoundError:
            return None

    def _first_start(self) -> InjectorOffset:
        now = now_ms()
        tps = self._probe.partitions()
        peeks = self._probe_at({tp: EARLIEST for tp in tps})
        positions: dict[TopicPartition, int] = {}
        progress: list[PartitionProgress] = []
        for tp in tps:
            peek = peeks[tp]
            if self._options.starting_offsets == "latest" or peek.offset is None:
                positions[tp] = peek.high
                progress.append(PartitionProgress(None))
            else:
                positions[tp] = peek.offset
                progress.append(PartitionProgress(self._record_times(peek, now)))
        estimate = injector_watermark(progress, now, self._options.idle_slack_ms)
        return InjectorOffset(positions, estimate, now // self._options.tick_ms)

    def freeze_targets(self) -> None:
        """Trigger.AvailableNow: read up to today's ends and no further (new partitions too)."""
        self._take_ahead()
        tps = self._probe.partitions()
        peeks = self._probe_at({tp: self._known_high.get(tp, EARLIEST) for tp in tps})
        self._targets = {tp: peek.high for tp, peek in peeks.items()}

    def latest(self, start: InjectorOffset, limit: int | None) -> InjectorOffset | None:
        """The next batch's end offset, or None when Spark should not run a batch yet.

        A batch runs when there are records to read, or, with nothing to read, once per tick
        (so the watermark moves and wall-time timers come due). Under AvailableNow no batch
        runs after the targets are reached, which is what ends the query.
        """
        ahead = self._take_ahead()
        now = now_ms()
        options = self._options
        tps = self._probe.partitions()
        positions = {tp: start.positions[tp] for tp in tps if tp in start.positions}
        new = [tp for tp in tps if tp not in start.positions]

        # 1. Fresh high watermarks. Skipped when admission control cannot reach the ends we
        #    already know in any partition: the probe at the end offsets (step 3) refreshes
        #    them anyway. A partition that would catch up is judged against fresh ones.
        skip = self._backlog_ends(positions, limit) is not None
        first: dict[TopicPartition, Peek] = {}
        at: dict[TopicPartition, int] = {tp: EARLIEST for tp in new}
        if not skip:
            at.update({tp: max(p, self._known_high.get(tp, p)) for tp, p in positions.items()})
        if at:
            first = self._probe_at(at, drain=True)
        high = {tp: self._known_high.get(tp, pos) for tp, pos in positions.items()}

        # 2. Admission control over what is available (capped at the AvailableNow targets).
        end = self._admit(positions, high, limit)

        # 3. The next unread record of every partition with lag (its time is the watermark).
        peeks: dict[TopicPartition, Peek] = {
            tp: first[tp] for tp in end if tp in first and at.get(tp) == end[tp]
        }
        missing = {tp: e for tp, e in end.items() if e < high[tp] and tp not in peeks}
        if ahead is not None and ahead[0] == missing:  # probed while the last batch ran
            began, ended, found = ahead[1]
            self._hold.observe(began, ended)
            for tp, peek in found.items():
                self._known_high[tp] = peek.high
            peeks.update(found)
        else:
            peeks.update(self._probe_at(missing))
        # 4. Caught-up partitions: the last record below the end offset (see `watermark`).
        #    One whose fetch stopped short of its high watermark ends after the newest record
        #    it brought, whose times stand in for the next record's (`_cut`).
        caught = {tp: e for tp, e in end.items() if e >= high[tp]}
        cut: dict[TopicPartition, Watermark] = {}
        for tp, e in caught.items():
            newest = self._cut(first.get(tp), positions[tp], e)
            times = None if newest is None else self._last_times(newest, now)
            if newest is not None and newest.offset is not None and times is not None:
                end[tp] = newest.offset + 1
                cut[tp] = times.min(Watermark(now, now))
        last = self._caught_up_records(
            {tp: e for tp, e in caught.items() if tp not in cut}, first, now
        )
        progress = [
            PartitionProgress(cut[tp])
            if tp in cut
            else PartitionProgress(None, last[tp])
            if tp in last
            else PartitionProgress(self._record_times(peeks[tp], now))
            for tp in end
        ]
        # New partitions join at their first record: nothing is read from them in this batch.
        for tp in new:
            peek = first[tp]
            end[tp] = peek.high if peek.offset is None else peek.offset
            progress.append(PartitionProgress(self._record_times(peek, now)))
        # Partitions that vanished from the metadata keep their position.
        for tp, pos in start.positions.items():
            end.setdefault(tp, pos)

        estimate = injector_watermark(progress, now, options.idle_slack_ms)
        estimate = self._hold.cap(estimate, now, options.idle_slack_ms)
        watermark = advance(start.watermark, estimate)
        tick = now // options.tick_ms
        moved = any(end[tp] != start.positions.get(tp) for tp in end)
        if not moved and (self._targets is not None or tick == start.tick):
            return None
        self._look_ahead(end, limit)
        return InjectorOffset(end, watermark, max(tick, start.tick))

    def _admit(
        self,
        positions: Mapping[TopicPartition, int],
        high: Mapping[TopicPartition, int],
        limit: int | None,
    ) -> dict[TopicPartition, int]:
        """Each partition's end: admission control over what is available below `high`
        (capped at the AvailableNow targets)."""
        cap = {tp: high.get(tp, pos) for tp, pos in positions.items()}
        if self._targets is not None:
            cap = {tp: min(h, self._targets.get(tp, positions[tp])) for tp, h in cap.items()}
        quota = allocate({tp: cap[tp] - pos for tp, pos in positions.items()}, limit)
        return {tp: pos + quota[tp] for tp, pos in positions.items()}

    def renew_probe(self) -> None:
        """Drop the probe's client after a probe failed (a stalled connection): the next probe
        connects afresh. What the planner knows stays: the outage hold (dropping it let the
        watermark pass records the broker held back during the outage), the partitions' last
        records, AvailableNow targets."""
        self._take_ahead()
        self._probe.close()

    def close(self) -> None:
        ahead, self._ahead = self._ahead, None
        busy = ahead is not None and not ahead.future.done()
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(wait=False)
        if self._watch is not None:
            self._watch.close()
        if not busy:  # a probe still running ahead (a broker gone quiet) keeps its client
            self._probe.close()
