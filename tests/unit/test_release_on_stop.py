"""What a stopped application built in a process is released there: its sinks (closed once,
other applications' kept), its transactional producers (its shards' only) and its shards' soft
state. A process running applications one after another grew by about 20 MB per application
before (the bench's throughput pipeline: driver 187 -> 434 MB over 13 applications)."""

from __future__ import annotations

from types import SimpleNamespace

from millstream.connectors import delivery
from millstream.connectors.delivery import Target, release_sinks
from millstream.sinks._shard_producer import ShardProducers
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardSoftState, SoftStateCache


class RecordingSink:
    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    def setup(self) -> None:
        pass

    def close(self) -> None:
        self.closed.append(self.name)


class NoCloseSink:
    def setup(self) -> None:
        pass


def test_a_stopped_applications_sinks_are_closed_once_and_forgotten() -> None:
    closed: list[str] = []
    a = delivery._built("app-a", "count", "out", Target(lambda: RecordingSink(closed, "a")))
    b = delivery._built("app-b", "count", "out", Target(lambda: RecordingSink(closed, "b")))
    delivery._built("app-a", "count", "plain", Target(NoCloseSink))  # duck-typed: no close()
    release_sinks("app-a")
    release_sinks("app-a")
    assert closed == ["a"]
    # Forgotten: a later run of app-a builds its sink again; app-b's is the same object.
    again = delivery._built("app-a", "count", "out", Target(lambda: RecordingSink(closed, "a2")))
    assert again is not a
    assert delivery._built("app-b", "count", "out", Target(lambda: RecordingSink(closed, "x"))) is b
    release_sinks("app-a")
    release_sinks("app-b")
    assert closed == ["a", "a2", "b"]


def test_draining_producers_takes_only_the_named_shards() -> None:
    cache = ShardProducers()
    ids = ["millstream.a.count.0", "millstream.a.count.1", "millstream.b.count.0"]
    for txn_id in ids:
        cache.put("cfg", SimpleNamespace(txn_id=txn_id), cap=64)  # type: ignore[arg-type]
    drained = cache.drain("cfg", {"millstream.a.count.0", "millstream.a.count.1"})
    assert sorted(s.txn_id for s in drained) == ids[:2]
    assert cache.get("cfg", "millstream.b.count.0") is not None
    assert cache.get("cfg", "millstream.a.count.0") is None


def test_a_stopped_applications_soft_state_is_dropped_and_others_kept() -> None:
    cache = SoftStateCache()
    for app in ("a", "b"):
        for shard in range(3):
            cache.put(ShardKeys(app, "count", shard), ShardSoftState(version=1, bloom=None))
    cache.drop_app("a")
    assert all(cache.get(ShardKeys("a", "count", s)) is None for s in range(3))
    assert all(cache.get(ShardKeys("b", "count", s)) is not None for s in range(3))
