"""The operator seam (docs/design.md section 11): the hooks a shard task calls at its steps.

`shard_task` runs the protocol (acquire, dedup, load, records, timers, commit) and calls the
computation's operator at the points it names:

- `expired(record, watermark)`: whether a fresh record is late for this operator (counted,
  then dropped, flagged or dead-lettered by the computation's `late` option);
- `after_load(runner, keys)`: once per shard batch, after the state of the batch's keys is
  loaded: where an operator makes its batched look-ups (one round trip for the batch);
- `process_key(runner, key, batch)`: a key's fresh, valid, not-expired records, in
  arrival order: where a windowed aggregation folds them into one partial accumulator per
  window before touching state (combiner lifting);
- `process_timer(runner, timer)`: a due timer, in firing order; or, for an operator with
  `timers_per_key`, `process_timers(runner, key, timers)`: a key's due timers at once, in
  firing order (a window's firing never moves another window's timer, so a key's windows
  closing in one batch cost one state decode and encode);
- `before_commit(runner)`: once per shard batch, before the one guarded commit;
- `before_delivery(plan, computation, shard, productions)`: on the driver, before committed
  productions leave the application (a join's registry insert decides which may);
- `throttle()`: read once by the runtime: which input streams to pause while a shard has too
  much waiting work (`connectors/throttle.py`; a join's waiting clicks).

Every effect goes through the `KeyRunner` into the shard's transaction, committed with the
ids of the records that caused it, so exactly-once holds for every operator alike.
`Computation` is one operator, through `ComputationOperator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from millstream.records import Production, Record, Timer

if TYPE_CHECKING:
    from millstream.connectors.computation import Computation
    from millstream.connectors.key_runner import KeyRunner
    from millstream.connectors.plan import BatchPlan
    from millstream.connectors.throttle import Throttle

# A key's batch of records: each fresh record with its routed row (for dead letters).
KeyBatch = Sequence[tuple[Record, tuple]]


class Operator:
    """A node of the topology as the shard task sees it. Subclass and override the hooks."""

    # The `late` options this operator accepts ("flag" hands a late record to user code,
    # which only a hand-written computation can do something with).
    late_policies: tuple[str, ...] = ("drop", "flag", "dead-letter")
    # True: the shard task hands a key's due timers over at once (`process_timers`); only
    # for an operator whose firings never move or delete the key's other due timers.
    timers_per_key = False
    # Output streams whose productions `before_delivery` may hold back: no computation of the
    # application may read them (a hand-over inside the batch would come before the gate).
    gated_streams: tuple[str, ...] = ()

    def expired(self, record: Record, watermark: int) -> bool:
        """Late: behind the input low watermark. Asked only of records behind it (a record at
        or after the watermark is on time for every operator)."""
        return record.timestamp < watermark

    def after_load(self, runner: KeyRunner, keys: Sequence[str]) -> None:
        """Once per shard batch, after the keys' state is loaded."""

    def process_key(self, runner: KeyRunner, key: str, batch: KeyBatch) -> None:
        raise NotImplementedError

    def process_timer(self, runner: KeyRunner, timer: Timer) -> None:
        """A due timer of `timer.key`; does nothing unless overridden."""

    def process_timers(self, runner: KeyRunner, key: str, timers: Sequence[Timer]) -> None:
        """A key's due timers, in firing order (`timers_per_key` operators)."""
        for timer in timers:
            self.process_timer(runner, timer)

    def before_commit(self, runner: KeyRunner) -> None:
        """Once per shard batch, before the commit."""

    def before_delivery(
        self, plan: BatchPlan, computation: str, shard: int, productions: Sequence[Production]
    ) -> tuple[list[Production], list[Production], dict[str, int]]:
        """On the driver, before committed productions leave the application: those to
        deliver, those to acknowledge without delivery (a join's lost registry race), and
        counters. By default every one is delivered."""
        return list(productions), [], {}

    def throttle(self) -> Throttle | None:
        """Input streams to pause while a shard has too many waiting events; None: never."""
        return None

    def read_ahead(self) -> tuple[str, ...]:
        """Streams whose events other inputs of this operator wait for: while the inputs are
        backlogged they are read with a larger admission budget (`READ_AHEAD`), so the waiting
        side finds them in its own batch instead of on a retry. None by default."""
        return ()

    def user_objects(self) -> list[Any]:
        """User-defined objects this operator calls (shipped to Spark's workers by value when
        their modules cannot be imported there)."""
        return []


class ComputationOperator(Operator):
    """A hand-written `Computation`: `process_record` per record, `process_timer` per timer,
    each its own call (its own state decode and encode)."""

    def __init__(self, computation: Computation) -> None:
        self.computation = computation

    def process_key(self, runner: KeyRunner, key: str, batch: KeyBatch) -> None:
        process = self.computation.process_record
        for record, row in batch:
            runner.run_record(key, process, record, row)

    def process_timer(self, runner: KeyRunner, timer: Timer) -> None:
        runner.run_timer(self.computation.process_timer, timer)

    def user_objects(self) -> list[Any]:
        return [type(self.computation)]
