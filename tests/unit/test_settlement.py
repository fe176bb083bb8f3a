"""Settlement.finish: a batch ends only when every settlement it started has ended."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from millstream.connectors.settlement import Settlement


class _Settlement(Settlement):
    """`settle` replaced: item "bad" raises at once, item "slow" takes a while."""

    def __init__(self) -> None:
        super().__init__(client=None, app="app")  # type: ignore[arg-type]
        self.ended: list[str] = []
        self.lock = threading.Lock()

    def settle(self, item: Any) -> dict[str, int]:
        if item.name == "bad":
            raise RuntimeError("settlement failed")
        time.sleep(0.3)
        with self.lock:
            self.ended.append(item.name)
        return {"delivered": 1}


def _item(name: str) -> Any:
    return SimpleNamespace(name=name, stage=SimpleNamespace(name=name))


def test_finish_waits_for_every_settlement_before_it_raises() -> None:
    settlement = _Settlement()
    try:
        with pytest.raises(RuntimeError, match="settlement failed"):
            settlement.finish([_item("bad"), _item("slow"), _item("slower")])
        # Nothing still delivers behind the failed batch, whose re-run settles these again.
        assert sorted(settlement.ended) == ["slow", "slower"]
    finally:
        settlement.pool.shutdown(wait=True)


def test_finish_sums_the_counters_per_computation() -> None:
    settlement = _Settlement()
    try:
        assert settlement.finish([_item("a"), _item("a"), _item("b")]) == {
            "a": {"delivered": 2},
            "b": {"delivered": 1},
        }
    finally:
        settlement.pool.shutdown(wait=True)


def test_a_batch_end_runs_behind_and_the_next_batch_waits_for_it() -> None:
    settlement = _Settlement()
    ended = threading.Event()

    def end() -> None:
        time.sleep(0.2)
        ended.set()

    settlement.run_behind(end)
    assert not ended.is_set()  # the batch returned before its end
    settlement.wait_behind()
    assert ended.is_set()
    settlement.wait_behind()  # nothing behind: returns at once
    settlement.shutdown()


def test_what_a_batch_end_raised_fails_the_next_batch_once() -> None:
    settlement = _Settlement()

    def end() -> None:
        raise RuntimeError("a sink refused its configuration")

    settlement.run_behind(end)
    with pytest.raises(RuntimeError, match="refused its configuration"):
        settlement.wait_behind()
    settlement.wait_behind()  # raised once: the re-run batch goes on
    settlement.shutdown()


def test_shutdown_lets_the_last_batch_end_finish_and_releases_every_thread() -> None:
    """A stopped application's delivery threads go (each kept a malloc arena: the driver of a
    process running applications one after another grew by about 30 MB an application)."""
    before = {t.ident for t in threading.enumerate()}
    settlement = _Settlement()
    settlement.finish([_item("a"), _item("b")])  # starts delivery threads
    ended = threading.Event()

    def end() -> None:
        time.sleep(0.2)
        ended.set()

    settlement.run_behind(end)
    settlement.shutdown()
    assert ended.is_set()
    deadline = time.monotonic() + 5  # idle pool threads leave on their own, soon after
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not left:
            break
        time.sleep(0.05)
    assert left == [], left
