"""What `millstream run` says while it runs: progress, dead letters, and a summary at the end.

Everything here is read in a thread of the driver, from what the runtime already leaves behind:
the metrics hashes it sums after each batch (`connectors/batch_metrics.py`) and the
dead-letters topic. The batch path does no extra work for it, and a slow Redis or broker
slows only the reports.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from millstream.state.keys import app_key

log = logging.getLogger(__name__)

# How often the dead-letter counters are read (one pipelined round trip for all computations)
# and the dead-letters topic's fetched letters taken: a few times a batch (a batch takes
# MILLSTREAM_TRIGGER_MS, 200 ms, or longer).
POLL_SECONDS = 0.2
# After a computation's first dead letter of a reason, its further ones are counted in one
# WARNING at most this often (or every report interval, if that is longer).
DEAD_LETTER_EVERY_S = 60.0
# Letters read from the topic per poll: bounds the reporter's work when millions arrive.
MAX_LETTERS_PER_POLL = 5000
# Counted by Redis but not found in the topic this long: warned without a reason.
UNREAD_GRACE_S = 10.0
# A dead-letters topic missing so far is looked for this often, so that it is assigned (and
# its fetch session warm) before the first letter has to be read from it.
LOOK_FOR_TOPIC_S = 1.0

_PREFIX = re.compile(r"^((?:[A-Za-z_][\w.]*: )+)")


def reason_kind(error: str) -> str:
    """What makes two dead letters "the same reason": the leading `Name: ` parts of their error
    (an exception type, or the runtime's `window: ValueError`), else the text with numbers
    blanked (oversized records differ only in their size)."""
    match = _PREFIX.match(error)
    if match:
        return match.group(1).rstrip(": ")
    return re.sub(r"\d+", "N", error)[:120]


@dataclass
class Totals:
    """One computation's counters as `millstream.status.status` reports them."""

    records: int = 0
    late: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    pending: int = 0
    lag_ms: int | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Totals:
        return cls(
            records=int(row.get("records", 0)),
            late=int(row.get("late_records", 0)),
            dead_letters=int(row.get("dead_letters", 0)),
            duplicates=int(row.get("duplicates_dropped", 0)),
            pending=int(row.get("pending_productions", 0)),
            lag_ms=row.get("lag_ms"),
        )

    def moved(self) -> tuple[int, ...]:
        """What changes when work happens (the lag changes with the clock alone)."""
        return (self.records, self.late, self.dead_letters, self.duplicates, self.pending)


def progress_line(name: str, now: Totals, before: Totals, seconds: float) -> str:
    rate = (now.records - before.records) / seconds if seconds > 0 else 0.0
    lag = "-" if now.lag_ms is None else f"{now.lag_ms / 1000:.1f} s"
    return (
        f"{name}: {rate:.1f} records/s ({now.records} in all), watermark lag {lag}, "
        f"late {now.late}, dead letters {now.dead_letters}, duplicates {now.duplicates}, "
        f"pending productions {now.pending}"
    )


def summary_line(
    app: str, seconds: float, start: Mapping[str, Totals], end: Mapping[str, Totals]
) -> str:
    """One line for the end of a run: per computation what this run did."""
    parts = []
    for name, now in end.items():
        was = start.get(name, Totals())
        parts.append(
            f"{name} {now.records - was.records} records, {now.late - was.late} late, "
            f"{now.dead_letters - was.dead_letters} dead letters, "
            f"{now.duplicates - was.duplicates} duplicates dropped, {now.pending} pending"
        )
    return f"app {app} stopped after {seconds:.0f} s; this run: " + ("; ".join(parts) or "nothing")


@dataclass
class _Letters:
    """Dead letters seen per computation since the reporter started."""

    counted: dict[str, int] = field(default_factory=dict)  # from Redis, since start
    read: Counter[str] = field(default_factory=Counter)  # from the topic, since start
    warned: set[tuple[str, str]] = field(default_factory=set)  # (computation, reason kind)
    kinds: dict[str, Counter[str]] = field(default_factory=dict)  # since the last count line
    last_count_line: dict[str, tuple[float, int]] = field(default_factory=dict)
    unread_since: dict[str, float] = field(default_factory=dict)


class Reporter(threading.Thread):
    """Logs progress lines, dead-letter warnings and, from `finish()`, the run's summary."""

    def __init__(
        self,
        app: str,
        computations: Sequence[str],
        client: Any,
        kafka: Mapping[str, str],
        dead_letter_topic: str,
        report_seconds: float,
        count_every: float | None = None,
    ) -> None:
        super().__init__(name="millstream-report", daemon=True)
        self.app = app
        self.computations = list(computations)
        self.client = client
        self.kafka = dict(kafka)
        self.topic = dead_letter_topic
        self.report_seconds = report_seconds
        self.count_every = count_every or max(DEAD_LETTER_EVERY_S, float(report_seconds))
        self._halt = threading.Event()
        self._consumer: Any = None
        self._letters = _Letters()
        self._assigned = False
        self.started = time.monotonic()
        # Baselines: what was there before this run is not news.
        self.start_totals = self._totals()
        self._base = self._dead_letter_counts()

    # --- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        try:  # the topic's ends first, then the counters: no letter falls between the two
            self._open_topic(from_start=False)
            self._base = self._dead_letter_counts()
        except Exception as exc:
            log.debug("dead-letters topic not readable yet: %s", exc)
        last_at, last = time.monotonic(), self.start_totals
        looked = time.monotonic()
        while not self._halt.wait(self._pause()):
            try:
                if not self._assigned and time.monotonic() - looked >= LOOK_FOR_TOPIC_S:
                    looked = time.monotonic()
                    self._open_topic(from_start=True)  # created by this run: all of it is news
                self.check_dead_letters()
                now = time.monotonic()
                if self.report_seconds and now - last_at >= self.report_seconds:
                    totals = self._totals()
                    for name, row in totals.items():
                        before = last.get(name, Totals())
                        if row.moved() != before.moved():
                            log.info("%s", progress_line(name, row, before, now - last_at))
                    last_at, last = now, totals
            except Exception as exc:  # a report must never stop the pipeline
                log.debug("report skipped: %s", exc)
                self._halt.wait(POLL_SECONDS)  # and never spin on a failing Redis or broker

    def finish(self) -> str:
        """Stop the thread; the one-line summary of this run."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        try:
            self.check_dead_letters()
            line = summary_line(
                self.app, time.monotonic() - self.started, self.start_totals, self._totals()
            )
        except Exception as exc:
            line = f"app {self.app} stopped after {time.monotonic() - self.started:.0f} s ({exc})"
        if self._consumer is not None:
            self._consumer.close()
        return line

    # --- reads -----------------------------------------------------------------------------
    def _totals(self) -> dict[str, Totals]:
        from millstream.status import status

        rows = status(self.client, self.app)["computations"]
        return {name: Totals.of(rows[name]) for name in self.computations if name in rows}

    def _dead_letter_counts(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for name in self.computations:
            pipe.hget(app_key(self.app, "metrics", name), "dead_letters")
        return {n: int(v or 0) for n, v in zip(self.computations, pipe.execute(), strict=True)}

    def _open_topic(self, *, from_start: bool) -> None:
        """Assign the dead-letters topic at its current ends, or at its start (a topic that did
        not exist when the run started holds only this run's letters)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self.kafka,
                    "group.id": f"millstream-report-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    # Letters land at the end of a batch: fetch them then, not 500 ms later.
                    "fetch.wait.max.ms": 50,
                }
            )
        meta = self._consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            self._assigned = False
            return
        parts = []
        for p in meta.partitions:
            tp = TopicPartition(self.topic, p, OFFSET_BEGINNING)
            if not from_start:  # one round trip per partition: only when its end is wanted
                tp.offset = self._consumer.get_watermark_offsets(tp, timeout=5)[1]
            parts.append(tp)
        self._consumer.assign(parts)
        self._assigned = True

    def _pause(self) -> float:
        """Between two checks: none while the topic is tailed (the wait is in its read)."""
        return 0.0 if self._assigned else POLL_SECONDS

    def check_dead_letters(self) -> None:
        """New dead letters: a WARNING per new (computation, reason), then counts at most
        every `count_every` seconds."""
        counts = self._dead_letter_counts()
        letters = self._letters
        now = time.monotonic()
        for name, total in counts.items():
            letters.counted[name] = total - self._base.get(name, 0)
        if self._assigned or any(letters.counted[n] > letters.read[n] for n in counts):
            # Tailed all along: a letter lands in the topic as its shard settles, before the
            # batch ends and the metrics hash counts it.
            self._read_topic()
        for name in counts:
            unread = letters.counted[name] - letters.read[name]
            if unread <= 0:
                letters.unread_since.pop(name, None)
            elif (
                now - letters.unread_since.setdefault(name, now) > UNREAD_GRACE_S
                and (name, "?") not in letters.warned
            ):
                letters.warned.add((name, "?"))
                log.warning(
                    "computation %s dead-lettered %d record(s) whose reason could not be "
                    "read yet from Kafka topic %s; read it there",
                    name,
                    unread,
                    self.topic,
                )
            self._count_line(name, now)

    def _read_topic(self) -> None:
        """Letters fetched so far, waiting up to POLL_SECONDS for the first."""
        if not self._assigned:
            self._open_topic(from_start=True)
            if not self._assigned:
                return
        read = 0
        while read < MAX_LETTERS_PER_POLL:
            messages = self._consumer.consume(num_messages=500, timeout=POLL_SECONDS)
            good = [m for m in messages if m.error() is None]
            if not good:
                return
            read += len(good)
            for message in good:
                self._letter(message.value())

    def _letter(self, raw: bytes | None) -> None:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return
        name = str(body.get("computation", "?"))
        error = str(body.get("error", ""))
        kind = reason_kind(error)
        letters = self._letters
        letters.read[name] += 1
        letters.kinds.setdefault(name, Counter())[kind] += 1
        if (name, kind) in letters.warned:
            return
        letters.warned.add((name, kind))
        if "timer" in body:
            timer = body["timer"] or {}
            cause = f"a timer (tag {timer.get('tag')!r}, time {timer.get('time')})"
        else:
            cause = f"a record of stream {body.get('stream')!r}"
        log.warning(
            "computation %s dead-lettered %s of key %r: %s. Dead letters (JSON with the reason, "
            "key and position) are in Kafka topic %s (list them with `millstream dead-letters "
            "%s`, replay them after a fix with --replay); more of them are counted every %.0f s",
            name,
            cause,
            body.get("key"),
            error,
            self.topic,
            self.app,
            self.count_every,
        )

    def _count_line(self, name: str, now: float) -> None:
        """The rate-limited count of a computation's dead letters since its last count line."""
        letters = self._letters
        total = letters.counted.get(name, 0)
        at, counted = letters.last_count_line.setdefault(name, (now, 0))
        if total <= counted or now - at < self.count_every:
            return
        kinds = letters.kinds.pop(name, Counter())
        log.warning(
            "computation %s: %d dead letter(s) in the last %.0f s (%d in this run)%s; topic %s",
            name,
            total - counted,
            now - at,
            total,
            ": " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common(5)) if kinds else "",
            self.topic,
        )
        letters.last_count_line[name] = (now, total)


class RunReport:
    """`millstream run`'s reports: its `on_tick` starts the reporter once the application runs
    (the endpoints are known only then, embedded ones included); `finish` logs the summary."""

    def __init__(self, report_seconds: float) -> None:
        self.report_seconds = report_seconds
        self.reporter: Reporter | None = None
        self._failed = False

    def on_tick(self, app: Any) -> None:
        if self.reporter is not None or self._failed:
            return
        from millstream.connectors.topology import DEAD_LETTERS
        from millstream.state.client import connect

        topology = app.topology
        try:
            self.reporter = Reporter(
                topology.app,
                list(topology.computations),
                connect(app.endpoints.redis_url, cached=False),
                app.endpoints.kafka,
                topology.topic_of(DEAD_LETTERS),
                self.report_seconds,
            )
        except Exception as exc:  # no reports is better than no pipeline
            self._failed = True
            log.warning("progress reports are off: %s", exc)
            return
        self.reporter.start()

    def finish(self) -> None:
        if self.reporter is not None:
            log.info("%s", self.reporter.finish())
