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
