"""Test-only crash points: SIGKILL the whole pipeline at a named step of the delivery protocol.

Never set these in production. Read once per process from the environment (not through
`Settings`: they are test-suite knobs, covered by the `MILLSTREAM_TEST_*` row of the README):

- `MILLSTREAM_TEST_CRASH_AT=<point>[:<n>]`: on the n-th time (default 1) any process of the
  pipeline reaches `<point>`, SIGKILL every process of the pipeline's session (driver, JVM, Python
  workers: run the pipeline in its own session, as `millstream.testing.process.PipelineProcess`
  does). The count is shared by the session's processes through a locked counter file.
- `MILLSTREAM_TEST_CRASH_FILE`: that counter file (default: `millstream-crash-<session id>` in
  the temporary folder). Each hit appends a line `<point> <count> <pid>`; the fatal one is
  followed by `CRASH <point> <count>`, written and fsynced before the kill, so a test can tell
  a crash at the point from any other death.

The runtime does not import this module: it calls `millstream.fault_points.fault_point`, and
`crash_point` is the hook it runs there once `MILLSTREAM_TEST_FAULT_HOOK` names it
(`with_crash_hook(env)` adds that to a pipeline's environment when it asks for a crash;
`PipelineProcess` does so).

Points (see `connectors/delivery.py`, `connectors/shard_task.py`, `connectors/fused.py` and `sinks/kafka_transactional.py`):

- `after_redis_commit`: productions are checkpointed in Redis; the sink was not called yet.
- `before_kafka_commit`: `KafkaTransactionalSink` produced the records and they are
  acknowledged, the transaction (with its progress offsets) is not committed.
- `after_kafka_commit`: the sink's `deliver` returned (committed / acknowledged by Kafka); the
  checkpoints are not acknowledged in Redis yet.
- `after_weak_delivery` (`connectors/shard_task.py`): a shard's weak productions are delivered
  downstream; its input ids, state and timers are not committed yet.
- `fused_after_consumers_commit` (`connectors/fused.py`): in a batch that handed productions
  over, every consumer committed them; nothing is delivered outside or acknowledged yet.
- `before_replays_removed` (`connectors/replay_intake.py`): a batch that took replayed dead
  letters committed and settled; their queue entries are not removed yet.
- `replay_chunk_queued` (`state/replay.py`, in `millstream dead-letters --replay`): a chunk of
  letters and their marks are queued; later chunks are not.
- `after_registry_insert` (`connectors/join_operator.py`): a join's output is registered in the
  IdRegistry under its token and not delivered yet.
- `rescale_after_retire`, `rescale_after_shard_written`, `rescale_after_switch`
  (`state/rescale.py`, run by the driver between batches): a rescale retired the old shards;
  wrote one more new shard; switched the recorded layout (old keys not deleted yet).
- `fused_after_stage_<computation>` (`connectors/fused.py`): that computation committed in this
  batch, the computations after it in the batch have not run yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from millstream.fault_points import ENV_HOOK

POINTS = (
    "after_redis_commit",
    "before_kafka_commit",
    "after_kafka_commit",
    "fused_after_consumers_commit",
    "after_weak_delivery",
    "before_replays_removed",
    "replay_chunk_queued",
    "after_registry_insert",
    "rescale_after_retire",
    "rescale_after_shard_written",
    "rescale_after_switch",
)
STAGE_POINT = "fused_after_stage_"  # + a computation's name: it committed, later ones did not
ENV_AT = "MILLSTREAM_TEST_CRASH_AT"
ENV_FILE = "MILLSTREAM_TEST_CRASH_FILE"
HOOK = "millstream.testing._crash:crash_point"  # MILLSTREAM_TEST_FAULT_HOOK naming crash_point

_Spec = tuple[str, int, Path]
_spec: list[_Spec | None] = []  # [(point, n, file) or None] once read: read once per process


def _read_spec() -> _Spec | None:
    raw = os.environ.get(ENV_AT, "").strip()
    if not raw:
        return None
    point, _, count = raw.partition(":")
    known = point in POINTS or point.startswith(STAGE_POINT)
    if not known or (count and not count.isdigit()) or count == "0":
        raise ValueError(
            f"{ENV_AT}={raw!r} is invalid: expected <point>[:<n>] with point one of "
            f"{', '.join(POINTS)}, {STAGE_POINT}<computation> and n >= 1"
        )
    path = os.environ.get(ENV_FILE)
    return point, int(count or 1), Path(path) if path else default_crash_file(os.getsid(0))


def with_crash_hook(env: Mapping[str, str]) -> dict[str, str]:
    """`env`, plus the fault hook that runs `crash_point` when it sets MILLSTREAM_TEST_CRASH_AT.

    Every process of a pipeline started with the result (driver, Spark's Python workers)
    installs the hook at its first fault point.
    """
    out = dict(env)
    if out.get(ENV_AT, "").strip():
        out.setdefault(ENV_HOOK, HOOK)
    return out


def default_crash_file(session_id: int) -> Path:
    """Where the counter goes when MILLSTREAM_TEST_CRASH_FILE is unset, for a session id."""
    return Path(tempfile.gettempdir()) / f"millstream-crash-{session_id}"


def crash_point(point: str) -> None:
    """The fault hook: does nothing unless MILLSTREAM_TEST_CRASH_AT names `point`."""
    if not _spec:
        _spec.append(_read_spec())
    spec = _spec[0]
    if spec is None:
        return
    wanted, n, path = spec
    if point != wanted:
        return
    with open(path, "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)  # released by close or by the kill
        counter.seek(0)
        hits = sum(1 for line in counter if not line.startswith("CRASH")) + 1
        counter.write(f"{point} {hits} {os.getpid()}\n")
        if hits == n:
            counter.write(f"CRASH {point} {hits}\n")
        counter.flush()
        os.fsync(counter.fileno())
        if hits == n:
            kill_session()


def session_members(session_id: int) -> list[int]:
    """PIDs of the live processes of a session (from /proc), excluding this process."""
    me = os.getpid()
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[3]) == session_id:  # state, ppid, pgrp, session
            members.append(int(entry))
    return members


def kill_session(session_id: int | None = None) -> None:
    """SIGKILL every process of the session (this one's by default), this process last."""
    sid = os.getsid(0) if session_id is None else session_id
    for _ in range(2):  # a second sweep catches a worker forked during the first
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if os.getsid(0) == sid:
        os.kill(os.getpid(), signal.SIGKILL)
