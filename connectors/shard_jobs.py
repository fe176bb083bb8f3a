"""Running a computation's busy shards for a batch: one Spark job, or the driver itself.

Only shards with input, a due timer or pending productions run (`busy_shards`). Their rows go
to at most as many Spark tasks as there are cores, in groups of about equal rows
(`balanced_groups`: keys are skewed), pickled by the standard library as plain tuples; each
task runs `shard_task.run_shard` for its shards in turn. With a local master the payloads and
results travel as files (`task_spool`), not through the JVM. A small batch
(MILLSTREAM_SMALL_BATCH_ROWS) runs its shards in the driver instead: scheduling a Spark job
costs about 0.2 s here, running a few shards a few ms. The protocol is the same either way.

Spark stops its pooled Python workers once no Python task has run for a minute, and a batch
that runs in the driver runs none: `WarmWorkers` runs a job of one task per core at the query's
start and after 45 quiet seconds, so a burst after a quiet spell, or the first large batch,
does not wait for Spark's daemon, new workers and Spark's cold job path. In the bench's
5,000 events/s phase (after a phase of small batches run in the driver) the first large
batch's Spark job took 1.8-2.4 s while its tasks ran 0.23-0.26 s; warmed, 0.6-0.8 s.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from millstream.connectors import memory, task_spool
from millstream.connectors.formats import AvroFormat
from millstream.connectors.plan import BatchPlan, TaskInput
from millstream.connectors.shard_task import STREAM, ShardResult, run_shard
from millstream.connectors.stage_plan import Stage
from millstream.connectors.topology import ComputationSpec
from millstream.state.client import RedisClient
from millstream.state.keys import ShardKeys

log = logging.getLogger(__name__)

# Spark's PythonWorkerFactory stops idle pooled workers after 60 s without a Python task (a fixed
# timeout); a job after `WARM_IDLE_S` quiet seconds keeps them.
WARM_IDLE_S = 45.0
WARM_CHECK_S = 5.0
_last_job = [float("-inf")]  # monotonic time of this process's last Spark job of shards
_SPOOL = task_spool.Spool()  # a local master's task files

# Formats whose decoded data travels to a task with its row: they decode into builtins and
# standard-library types only (pickled by the standard library), and decoding again would cost
# more than carrying it. JSON is decoded again in the task (msgspec: about 0.3 us a value,
# less than pickling and unpickling the decoded object). A user's ValueFormat may return
# instances of classes only its driver script defines, which only cloudpickle carries: its
# values are decoded again in the task too.
_CARRIED_FORMATS = (AvroFormat,)


def task_payload(spec: ComputationSpec, group: list[tuple[int, list[TaskInput]]]) -> bytes:
    """One Spark task's shards and their rows, pickled here by the standard library as plain
    tuples: `parallelize` would cloudpickle them, 0.29 s for 20,000 rows on this machine
    against 0.035 s. Decoded values travel only for the formats above; the task decodes the
    others again (`shard_task.decode_inputs`)."""
    carried = {s for s, f in spec.formats.items() if type(f) in _CARRIED_FORMATS}
    return pickle.dumps(
        [
            (
                shard,
                [
                    (i.key, i.row, i.error, i.data, i.decoded)
                    if not i.decoded or i.row[STREAM] in carried
                    else (i.key, i.row, i.error, None, False)
                    for i in items
                ],
            )
            for shard, items in group
        ],
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def balanced_groups(shards: Sequence[int], rows: dict[int, int], groups: int) -> list[list[int]]:
    """`shards` in `groups` groups of about equal rows (largest first, each to the lightest
    group so far): keys are skewed (a Zipf workload's busiest shard can hold a third of a
    batch), and the job lasts as long as its heaviest task. Each group is in shard order."""
    heap: list[tuple[int, int, int, list[int]]] = [
        (0, 0, i, []) for i in range(max(1, min(groups, len(shards))))
    ]  # (rows, shards, index, members): ties go to the group with fewer shards
    for shard in sorted(shards, key=lambda s: (-rows.get(s, 0), s)):
        load, count, index, members = heapq.heappop(heap)
        members.append(shard)
        heapq.heappush(heap, (load + rows.get(shard, 0), count + 1, index, members))
    return [sorted(g[3]) for g in sorted(heap, key=lambda g: g[2])]


def _fused_task(
    plan: BatchPlan, spec: ComputationSpec, payloads: Iterator[bytes | str]
) -> Iterator[bytes | str]:
    """Executor side: run each payload's shards one after the other; their results go back
    as one list pickled by the standard library (cloudpickle is several times slower). A
    spooled payload (a path, `task_spool`) has that list written to a file beside it, whose
    path goes back instead."""
    out: list[bytes | str] = []
    with no_cyclic_gc():
        for payload in payloads:
            path = payload if isinstance(payload, str) else None
            data = task_spool.read_payload(payload) if isinstance(payload, str) else payload
            results = pickle.dumps(
                [
                    run_shard(plan, spec, shard, [TaskInput(*item) for item in items])
                    for shard, items in pickle.loads(data)
                ],
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            del data
            out.append(results if path is None else task_spool.write_results(path, results))
            del results
    memory.trim()  # the task's rows are freed; the worker lives on for the next batch's tasks
    yield from out


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Batch work without the cyclic garbage collector: it allocates a row's worth of objects
    per record, few of them in cycles, and every collection the allocations trigger would walk
    the process's whole heap (Spark's and py4j's objects in the driver). What cycles the batch
    leaves are collected once it is over. The previous state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def busy_shards(
    client: RedisClient,
    app: str,
    stage: Stage,
    inputs: dict[int, list[TaskInput]],
    event_wm: int,
    now: int,
) -> list[int]:
    """Shards with input, a due timer or pending productions: the others run no task."""
    idle = [s for s in range(stage.shards) if s not in inputs]
    if not idle:
        return list(range(stage.shards))
    pipe = client.pipeline(transaction=False)
    for shard in idle:
        keys = ShardKeys(app, stage.name, shard, stage.generation)
        pipe.zrangebyscore(keys.timers("event"), "-inf", event_wm, start=0, num=1)
        pipe.zrangebyscore(keys.timers("wall"), "-inf", now, start=0, num=1)
        pipe.hlen(keys.productions)
    answers = pipe.execute()
    working = {
        shard
        for i, shard in enumerate(idle)
        if answers[3 * i] or answers[3 * i + 1] or answers[3 * i + 2]
    }
    return sorted(set(inputs) | working)


def run_shards(
    spark: Any,
    plan: BatchPlan,
    stage: Stage,
    inputs: dict[int, list[TaskInput]],
    busy: list[int],
    small_batch_rows: int,
) -> list[ShardResult]:
    """One Spark job over the busy shards, or (at most `small_batch_rows` rows) the driver."""
    if not busy:
        return []
    rows = sum(len(inputs.get(s, ())) for s in busy)
    if rows <= small_batch_rows:
        return [run_shard(plan, stage.spec, s, list(inputs.get(s, []))) for s in busy]
    context = spark.sparkContext
    slots = max(1, min(len(busy), context.defaultParallelism))
    groups = balanced_groups(busy, {s: len(inputs.get(s, ())) for s in busy}, slots)
    payloads = (task_payload(stage.spec, [(s, inputs.get(s, [])) for s in g]) for g in groups)
    context.setLocalProperty("spark.scheduler.pool", "millstream")
    task = functools.partial(_fused_task, plan, stage.spec)
    _last_job[0] = time.monotonic()
    spooled = task_spool.local_master(context.master)
    with _SPOOL.job(payloads) if spooled else contextlib.nullcontext(list(payloads)) as sent:
        found: list[ShardResult] = []
        for out in context.parallelize(sent, slots).mapPartitions(task).collect():
            found.extend(pickle.loads(task_spool.take_results(out) if spooled else out))
        return found


def _touch(rows: Iterator[int]) -> Iterator[int]:
    """A warming task: reads its input to the end (a worker that leaves input unread is not
    reused) and imports what a shard task does (a no-op where the daemon preloaded it)."""
    from millstream.connectors import shard_task  # noqa: F401

    yield from (os.getpid() for _ in rows)


class WarmWorkers:
    """Keeps Spark's Python workers (one per core) alive for the shard jobs: a job of one task
    per core at start, while the query starts, and again whenever no shard job ran for
    `WARM_IDLE_S`."""

    def __init__(self) -> None:
        self.context: Any = None
        self.pids: list[int] = []  # the workers the last warming job ran in
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="millstream-warm", daemon=True)

    def start(self, spark: Any) -> None:
        """Start warming (once: a restarted query keeps its runner's)."""
        if self.context is None:
            self.context = spark.sparkContext
            self._thread.start()

    def stop(self) -> None:
        self._halt.set()

    def _run(self) -> None:
        first = True
        while not self._halt.is_set():
            if first or time.monotonic() - _last_job[0] >= WARM_IDLE_S:
                first = False
                _last_job[0] = time.monotonic()
                try:
                    slots = max(1, self.context.defaultParallelism)
                    self.context.setLocalProperty("spark.scheduler.pool", "millstream")
                    job = self.context.parallelize(range(slots), slots).mapPartitions(_touch)
                    self.pids = sorted(set(job.collect()))
                except Exception as exc:  # a stopping session; a real job starts workers anyway
                    log.debug("warming Spark's Python workers: %s", exc)
            self._halt.wait(WARM_CHECK_S)
