"""The replay queue (`state/replay.py`) on a single Redis and a Redis Cluster.

A letter is queued once however often it is replayed; each chunk goes in with its marks or not
at all; the driver takes only its computations' entries, and removing them empties the queue.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from millstream.fault_points import install_fault_hook, remove_fault_hook
from millstream.state import replay
from millstream.state.replay import Replay


def _letters(n: int, computation: str = "c") -> list[Replay]:
    return [
        Replay(uuid.uuid4().bytes, computation, "events", b"k", f"v{i}".encode(), i, ())
        for i in range(n)
    ]


def test_a_letter_is_queued_once_however_often_it_is_replayed(store_client: Any) -> None:
    app = f"mstest-{uuid.uuid4().hex[:12]}"
    letters = _letters(replay.CHUNK + 20)
    first = replay.enqueue(store_client, app, letters[:30] + letters[:5])  # repeats inside, too
    assert (first.queued, first.already) == (30, 0)
    again = replay.enqueue(store_client, app, letters)
    assert (again.queued, again.already) == (len(letters) - 30, 30)
    assert replay.queued(store_client, app) == len(letters)
    taken = replay.read_queue(store_client, app, ["c"], count=10_000)
    assert [r for _, r in taken] == letters  # oldest first, every field back
    replay.remove(store_client, app, [entry for entry, _ in taken])
    assert replay.queued(store_client, app) == 0
    assert replay.enqueue(store_client, app, letters).queued == 0  # marked for good


def test_a_chunk_goes_in_with_its_marks_or_not_at_all(store_client: Any) -> None:
    app = f"mstest-{uuid.uuid4().hex[:12]}"
    letters = _letters(replay.CHUNK * 2 + 1)

    def stop_after_first(point: str) -> None:
        if point == "replay_chunk_queued":
            raise KeyboardInterrupt  # the command killed between two chunks

    install_fault_hook(stop_after_first)
    try:
        with pytest.raises(KeyboardInterrupt):
            replay.enqueue(store_client, app, letters)
    finally:
        remove_fault_hook(stop_after_first)
    assert replay.queued(store_client, app) == replay.CHUNK
    rest = replay.enqueue(store_client, app, letters)
    assert (rest.queued, rest.already) == (replay.CHUNK + 1, replay.CHUNK)


def test_the_driver_takes_its_own_computations_entries(store_client: Any) -> None:
    app = f"mstest-{uuid.uuid4().hex[:12]}"
    replay.enqueue(store_client, app, _letters(3, "a") + _letters(2, "b"))
    mine = replay.read_queue(store_client, app, ["b"], count=100)
    assert [r.computation for _, r in mine] == ["b", "b"]
    # Read a page at a time: the other computations' entries never hide these.
    assert replay.read_queue(store_client, app, ["b"], count=100, page=2) == mine
    assert len(replay.read_queue(store_client, app, ["a"], count=2, page=1)) == 2
    offsets = [replay.entry_offset(entry) for entry, _ in mine]
    assert offsets == sorted(set(offsets))  # a position per entry, in queue order
    replay.remove(store_client, app, [entry for entry, _ in mine])
    assert replay.queued(store_client, app) == 3  # the other query's are left
