"""Windowed aggregations as an operator (`Topology.window`), with Dataflow's combiner lifting.

Per key, the state holds the open windows only: `[[start, end, accumulator, fired], ...]`, and
each window has one event timer (tag `"start:end"`) at its end. When the low watermark
reaches a window's end, the timer emits `{"key", "start", "end", "result", "update": false}`
stamped at the end, and the window is deleted with its timer, or, with allowed lateness, kept
until `end + allowed_lateness_ms` (the same timer, moved) so that a late record within it
updates the window and re-emits it with `"update": true`. A record whose every window is past
its allowed lateness is late (`expired`): counted, then dropped or dead-lettered.

Lifted (the default): a key's records of a batch are grouped by window and each window's
values folded into one partial accumulator first (`Combiner.add_all`), then each partial is
merged into the stored accumulator once (`Combiner.merge`): one state decode and encode and
one timer write per key and window per batch, instead of one per record. A built-in that
reads only the record's value (`Combiner.from_value`) takes timestamps and values from the
batch's rows (`KeyRecords`), with no `Record` built. The records' ids still enter the catalog
in the same commit as the merged effect (`shard_task.commit`), so a replayed batch folds
nothing twice. Unlifted (`lift=False`) runs the same merge once per record. Should a lifted
call fail (a user combiner raising), the key's batch runs unlifted, so only the records that
fail become dead letters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from millstream.connectors.combiners import Combiner
from millstream.connectors.fresh_records import KeyRecords
from millstream.connectors.operator import KeyBatch, Operator
from millstream.connectors.windows import Tumbling, Window, WindowKind, merge_overlapping
from millstream.records import Record, Timer

if TYPE_CHECKING:
    from millstream.connectors.computation import Context
    from millstream.connectors.key_runner import KeyRunner

Partials = dict[Window, Any]
Stored = dict[Window, list[Any]]  # window -> [accumulator, fired]


def _tag(window: Window) -> str:
    return f"{window[0]}:{window[1]}"


class WindowOperator(Operator):
    """One windowed aggregation: `window` assigns, `combiner` aggregates, results go to
    `output`."""

    late_policies = ("drop", "dead-letter")
    timers_per_key = True  # closing a window never moves another window's timer

    def __init__(
        self,
        window: WindowKind,
        combiner: Combiner,
        output: str,
        *,
        allowed_lateness_ms: int = 0,
        lift: bool = True,
    ) -> None:
        self.window = window
        self.combiner = combiner
        self.output = output
        self.allowed_lateness_ms = allowed_lateness_ms
        self.lift = lift

    def user_objects(self) -> list[Any]:
        field = getattr(self.combiner, "field", None)
        return [type(self.combiner), *([field] if callable(field) else [])]

    # --- hooks -------------------------------------------------------------------------------
    def expired(self, record: Record, watermark: int) -> bool:
        """Every window of the record is past its end plus the allowed lateness."""
        return self.window.last_end(record.timestamp) + self.allowed_lateness_ms <= watermark

    def process_key(self, runner: KeyRunner, key: str, batch: KeyBatch) -> None:
        timestamps, values, indexes = self._values(runner, key, batch)
        if not indexes:
            return
        watermark = runner.low_watermark
        if self.lift:
            first = min(range(len(indexes)), key=timestamps.__getitem__)
            cause = batch[indexes[first]][0]  # the earliest: productions stamped at or after it

            def fold_and_merge(ctx: Context, _: Any) -> None:
                self._merge(ctx, self._fold_all(timestamps, values, watermark), watermark)

            outcome = runner.call(key, fold_and_merge, cause)
            if not isinstance(outcome, Exception):
                runner.apply(key, outcome)
                runner.count("records", len(indexes))
                runner.count("window_partials", 1)
                return
        # unlifted, or a lifted call that failed: each record on its own
        for position, index in enumerate(indexes):
            record, row = batch[index]
            value = 1 if values is None else values[position]

            def merge_one(ctx: Context, rec: Record, value: Any = value) -> None:
                partials: Partials = {}
                self._fold(partials, rec.timestamp, value, watermark)
                self._merge(ctx, partials, watermark)

            runner.run_record(key, merge_one, record, row)

    def _values(
        self, runner: KeyRunner, key: str, batch: KeyBatch
    ) -> tuple[list[int], list[Any] | None, list[int]]:
        """The timestamps and values the combiner adds (None: a count, whose values are all 1)
        of the batch's records it can read, and their indexes in `batch`; a record whose value
        it cannot read is a dead letter. Read from the rows where the combiner needs only the
        value (`KeyRecords`, `Combiner.from_value`), else from the records."""
        combiner = self.combiner
        rows = batch if isinstance(batch, KeyRecords) and combiner.from_value else None
        timestamps = rows.timestamps() if rows is not None else [r.timestamp for r, _ in batch]
        if not combiner.reads_value:
            return timestamps, None, list(range(len(timestamps)))
        values: list[Any] = []
        kept: list[int] = []
        for index in range(len(timestamps)):
            try:
                if rows is not None:
                    value = combiner.value_of(rows.data(index), rows.value(index))
                else:
                    value = combiner.extract(batch[index][0])
            except Exception as exc:  # bad input: this record alone is a dead letter
                runner.dead_letter(key, f"window: {type(exc).__name__}: {exc}", batch[index][1])
                continue
            values.append(value)
            kept.append(index)
        if len(kept) < len(timestamps):
            timestamps = [timestamps[i] for i in kept]
        return timestamps, values, kept

    def process_timer(self, runner: KeyRunner, timer: Timer) -> None:
        runner.run_timer(self._on_timer, timer)

    def process_timers(self, runner: KeyRunner, key: str, timers: Sequence[Timer]) -> None:
        """A key's windows closing in this batch: one call, one state decode and encode (each
        result stamped at its window's end, at or after the first timer's time). Should it
        fail, each timer fires on its own, so only a failing window is a dead letter."""
        if len(timers) == 1:
            runner.run_timer(self._on_timer, timers[0])
            return

        def close_all(ctx: Context, _: Any) -> None:
            stored = self._load(ctx)
            for timer in timers:
                self._close(ctx, stored, timer)
            self._save(ctx, stored)

        outcome = runner.call(key, close_all, timers[0])
        if isinstance(outcome, Exception):
            for timer in timers:
                runner.run_timer(self._on_timer, timer)
            return
        runner.apply(key, outcome)
        runner.count("timers_fired", len(timers))

    # --- the aggregation ---------------------------------------------------------------------
    def _fold_all(
        self, timestamps: Sequence[int], values: Sequence[Any] | None, watermark: int
    ) -> Partials:
        """A key's batch as one partial per window still accepting records: each window's
        values in arrival order (`values` None: a count, which reads how many), added at once
        (`Combiner.add_all`), as `_fold` record by record would."""
        added: Sequence[Any] = timestamps if values is None else values
        groups: dict[Window, list[Any]] = {}
        window = self.window
        if isinstance(window, Tumbling):
            size = window.size_ms
            starts: dict[int, list[Any]] = {}
            for timestamp, value in zip(timestamps, added, strict=True):
                start = timestamp - timestamp % size
                group = starts.get(start)
                if group is None:
                    starts[start] = [value]
                else:
                    group.append(value)
            groups = {(start, start + size): group for start, group in starts.items()}
        else:
            for timestamp, value in zip(timestamps, added, strict=True):
                for assigned in window.assign(timestamp):
                    groups.setdefault(assigned, []).append(value)
        combiner, lateness = self.combiner, self.allowed_lateness_ms
        return {
            w: combiner.add_all(combiner.create(), group)
            for w, group in groups.items()
            if w[1] + lateness > watermark  # else past its lateness: another of theirs is not
        }

    def _fold(self, partials: Partials, timestamp: int, value: Any, watermark: int) -> None:
        """Add one record's value to the partial of each of its windows still accepting it."""
        combiner, lateness = self.combiner, self.allowed_lateness_ms
        for window in self.window.assign(timestamp):
            if window[1] + lateness <= watermark:
                continue  # this window is past its lateness; another of the record's is not
            acc = partials.get(window)
            partials[window] = combiner.add(combiner.create() if acc is None else acc, value)

    def _load(self, ctx: Context) -> Stored:
        return {(s, e): [acc, fired] for s, e, acc, fired in ctx.get_state([])}

    def _save(self, ctx: Context, stored: Stored) -> None:
        if stored:
            ctx.set_state([[s, e, acc, fired] for (s, e), (acc, fired) in sorted(stored.items())])
        else:
            ctx.delete_state()

    def _merge(self, ctx: Context, partials: Partials, watermark: int) -> None:
        """Merge partials into the stored windows (sessions: merging overlapping ones), then
        re-emit each fired window a late record updated."""
        stored = self._load(ctx)
        combiner = self.combiner
        updated: list[Window] = []
        if self.window.merging:
            self._merge_sessions(ctx, stored, partials, updated, watermark)
        else:
            for window, part in partials.items():
                entry = stored.get(window)
                if entry is None:
                    stored[window] = [part, 0]
                    ctx.set_timer(_tag(window), window[1])
                    if window[1] <= watermark:
                        ctx_count(ctx, "late_accepted")
                else:
                    entry[0] = combiner.merge(entry[0], part)
                    if entry[1]:
                        updated.append(window)
        for window in updated:
            if window[1] <= watermark:  # closed and emitted: re-emit now, marked
                self._emit(ctx, window, stored[window][0], update=True)
        self._save(ctx, stored)

    def _merge_sessions(
        self,
        ctx: Context,
        stored: Stored,
        partials: Partials,
        updated: list[Window],
        watermark: int,
    ) -> None:
        """Each group of overlapping sessions (stored and new) becomes their union: one
        accumulator, one timer; a union of a session already emitted is an update."""
        combiner = self.combiner
        for union, members in merge_overlapping([*stored, *partials]).items():
            if not any(m in partials for m in members):
                continue  # stored sessions nothing in this batch touched
            acc: Any = None
            fired = 0
            for member in dict.fromkeys(members):
                entry = stored.pop(member, None)
                if entry is not None:
                    acc = entry[0] if acc is None else combiner.merge(acc, entry[0])
                    fired = fired or entry[1]
                    if member != union:
                        ctx.delete_timer(_tag(member))
                part = partials.get(member)
                if part is not None:
                    acc = part if acc is None else combiner.merge(acc, part)
            stored[union] = [acc, fired]
            closed = union[1] <= watermark
            # Emitted and still closed: re-emitted now, kept until its lateness is over. Else
            # (new, or grown past the watermark) its end emits it.
            lateness = self.allowed_lateness_ms if fired and closed else 0
            ctx.set_timer(_tag(union), union[1] + lateness)
            if fired:
                updated.append(union)
            elif closed:
                ctx_count(ctx, "late_accepted")

    def _on_timer(self, ctx: Context, timer: Timer) -> None:
        stored = self._load(ctx)
        self._close(ctx, stored, timer)
        self._save(ctx, stored)

    def _close(self, ctx: Context, stored: Stored, timer: Timer) -> None:
        """A window's end: emit it (an update if it was emitted before); keep it for late
        records until its allowed lateness is over, then delete it."""
        start, _, end = timer.tag.partition(":")
        window = (int(start), int(end))
        entry = stored.get(window)
        if entry is None:
            return  # merged into another session, or deleted
        acc, fired = entry
        if fired and timer.time >= window[1] + self.allowed_lateness_ms:
            del stored[window]  # lateness over: nothing can change it any more
            return
        self._emit(ctx, window, acc, update=bool(fired))
        if self.allowed_lateness_ms > 0:
            entry[1] = 1
            ctx.set_timer(timer.tag, window[1] + self.allowed_lateness_ms)
        else:
            del stored[window]

    def _emit(self, ctx: Context, window: Window, acc: Any, *, update: bool) -> None:
        if update:
            ctx_count(ctx, "window_updates")
        else:
            ctx_count(ctx, "windows_emitted")
        result = self.combiner.result(acc)
        value = {"key": ctx.key, "start": window[0], "end": window[1], "result": result}
        value["update"] = update
        ctx.produce(self.output, ctx.key, value, window[1])


def ctx_count(ctx: Context, name: str) -> None:
    """Counters an operator raises from inside a call travel with its effects (a call that is
    retried or fails counts nothing)."""
    ctx.counters[name] = ctx.counters.get(name, 0) + 1
