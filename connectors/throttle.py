"""Throttling: a join's waiting primary events are bounded per shard (Photon, seed 004).

A click whose query has not arrived waits in the joiner's state with a wall-time retry timer.
When queries fall behind, clicks would pile up there without bound. So before each batch the
driver counts each joiner shard's waiting clicks after a batch (its wall-time timers: one per
waiting click; one round trip for all shards), and while any shard holds more than the join's
`max_waiting` it sets a flag (`ms:{app}:throttle`, field = the primary stream) that the stream's injectors
read when they plan the next batch: they admit no new records of that stream, and hold its
watermark at the first unread record. The other streams (the queries) keep flowing and batches
keep running once per tick, so retries keep draining the waiting clicks; below the bound the
flag goes and the primary's backlog is read again. A shard so holds at most `max_waiting`
plus one batch's clicks (the flag is read one batch later).

A pause lasts at most `max_hold_ms` at a stretch (the join's give-up time): waiting clicks are
given up by the low watermark, which a paused stream holds, so a pause that only retries could
end might never end. After that long one batch's worth of input is let through, and the
throttle engages again if the shards are still over the bound.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from millstream.connectors.stage_plan import Stage
from millstream.state.throttle import throttle_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Throttle:
    """What an operator asks of the runtime: pause `streams` while a shard has more than
    `max_waiting` waiting events, for at most `max_hold_ms` at a stretch."""

    streams: tuple[str, ...]
    max_waiting: int
    max_hold_ms: int


def decide(worst: int, throttle: Throttle, since: int | None, now: int) -> str:
    """`engage`, `hold`, `release` (under the bound again), `breathe` (paused `max_hold_ms`:
    let one batch in) or `idle`. `since`: when the current pause began, None when there is
    none."""
    over = worst > throttle.max_waiting
    if since is None:
        return "engage" if over else "idle"
    if not over:
        return "release"
    return "breathe" if now - since >= throttle.max_hold_ms else "hold"


class Throttles:
    """The driver's throttles, one per throttled computation of the query (module doc)."""

    def __init__(self, client: Any, app: str, stages: Iterable[Stage]) -> None:
        self.client = client
        self.app = app
        self.stages = [
            (stage, throttle)
            for stage in stages
            if (throttle := stage.spec.operator.throttle()) is not None
        ]
        self.since: dict[str, int] = {}
        self.worst: dict[str, int] = {}  # the `waiting_max` last written, per computation
        if self.stages:
            # A run that stopped while paused left its flags: this run decides afresh.
            streams = [s for _, t in self.stages for s in t.streams]
            client.hdel(throttle_key(app), *streams)

    def check(self, now: int) -> None:
        """After a batch, before Spark plans the next: count each throttled computation's
        waiting events per shard, and pause or resume its primary streams. One round trip,
        and a second only when something changed."""
        if not self.stages:
            return
        pipe = self.client.pipeline(transaction=False)
        for stage, _ in self.stages:
            for keys in stage.keys(self.app):
                pipe.zcard(keys.timers("wall"))
        counts = [int(n) for n in pipe.execute()]
        writes = self.client.pipeline(transaction=False)
        at = 0
        for stage, throttle in self.stages:
            waiting = counts[at : at + stage.shards]
            at += stage.shards
            worst = max(waiting, default=0)
            since = self.since.get(stage.name)
            action = decide(worst, throttle, since, now)
            if self.worst.get(stage.name) != worst:
                self.worst[stage.name] = worst
                writes.hset(stage.metrics_key, "waiting_max", worst)
            if action == "engage":
                self.since[stage.name] = now
                state = json.dumps({"since": now, "waiting": waiting, "max": throttle.max_waiting})
                writes.hset(throttle_key(self.app), mapping=dict.fromkeys(throttle.streams, state))
                writes.hincrby(stage.metrics_key, "throttled", 1)
                log.warning(
                    "%s: %d events waiting in one shard (max_waiting=%d): pausing new input of "
                    "%s while retries drain",
                    stage.name, worst, throttle.max_waiting, ", ".join(throttle.streams),
                )  # fmt: skip
            elif action in ("release", "breathe") and since is not None:
                del self.since[stage.name]
                writes.hdel(throttle_key(self.app), *throttle.streams)
                writes.hincrbyfloat(stage.metrics_key, "throttle_seconds", (now - since) / 1000)
                if action == "release":
                    log.warning(
                        "%s: %d events waiting at most per shard: taking new input of %s again "
                        "after %.1fs", stage.name, worst, ", ".join(throttle.streams),
                        (now - since) / 1000,
                    )  # fmt: skip
                else:
                    log.warning(
                        "%s: still %d events waiting in one shard after a %.0fs pause (the "
                        "join's give-up time): letting one batch of %s in, so the low watermark "
                        "moves and waiting events can be given up",
                        stage.name, worst, throttle.max_hold_ms / 1000, ", ".join(throttle.streams),
                    )  # fmt: skip
        if len(writes):
            writes.execute()
