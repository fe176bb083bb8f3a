"""Each computation's shard layout: its shard count and generation (MillWheel's key intervals).

A key's shard is `mmh3(key) mod S`. The layout is recorded at a computation's first start and
checked at every start: starting again with another S would send keys to shards that do not
hold their state, timers, pending productions or catalog entries, so replays would no longer be
recognised. The count changes only by a rescale (`state/rescale.py`, `millstream rescale`),
which writes the new shards under the next generation's keys (`ShardKeys.generation`) and then
switches the recorded layout; from then on the recorded layout is what runs, whatever count
the configuration names.

Recorded as the hash `ms:{app}:shards`, computation -> "S" (generation 0, as versions before
rescaling wrote it) or "S@G". A rescale request waits in `ms:{app}:rescale` (computation ->
target count) until the application's driver applies it between two batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from millstream.errors import ConfigurationError
from millstream.state.client import RedisClient
from millstream.state.keys import ShardKeys, app_key

log = logging.getLogger(__name__)

MAX_SHARDS = 4096  # as settings.shards allows


@dataclass(frozen=True, slots=True)
class ShardLayout:
    shards: int
    generation: int = 0

    def encode(self) -> str:
        return str(self.shards) if not self.generation else f"{self.shards}@{self.generation}"

    @classmethod
    def decode(cls, raw: bytes | str) -> ShardLayout:
        text = raw.decode() if isinstance(raw, bytes) else raw
        count, _, generation = text.partition("@")
        return cls(int(count), int(generation or 0))

    def keys(self, app: str, computation: str) -> list[ShardKeys]:
        return [ShardKeys(app, computation, s, self.generation) for s in range(self.shards)]

    def describe(self) -> str:
        return f"{self.shards} shards (layout generation {self.generation})"


def shard_counts_key(app: str) -> str:
    """Hash computation -> its recorded layout."""
    return app_key(app, "shards")


def rescale_requests_key(app: str) -> str:
    """Hash computation -> the shard count a `millstream rescale` asked for, until applied."""
    return app_key(app, "rescale")


def rescale_reports_key(app: str) -> str:
    """Hash computation -> JSON report of its last rescale (what moved, how long it took)."""
    return app_key(app, "rescaled")


def retired_layouts_key(app: str) -> str:
    """Hash computation -> the layout a rescale left behind, until its keys are deleted."""
    return app_key(app, "shards-retired")


def read_layout(client: RedisClient, app: str, computation: str) -> ShardLayout | None:
    raw = client.hget(shard_counts_key(app), computation)
    return None if raw is None else ShardLayout.decode(raw)


def record_layout(client: RedisClient, app: str, computation: str, shards: int) -> ShardLayout:
    """The layout `computation` runs with: recorded now if it has none (the first start).

    HSETNX makes concurrent first starts agree. A configured count other than the recorded one
    stops the start, unless a rescale wrote the recorded layout: then it stands, and the
    configuration is told so in the log. One round trip.
    """
    key = shard_counts_key(app)
    pipe = client.pipeline(transaction=False)
    pipe.hsetnx(key, computation, shards)
    pipe.hget(key, computation)
    _, raw = pipe.execute()
    layout = ShardLayout.decode(raw)
    if layout.shards == shards:
        return layout
    if layout.generation:
        log.warning(
            "computation %s of app %s runs with %s, as `millstream rescale` left it; its "
            "configured count %d is not used (rescale again to change it)",
            computation, app, layout.describe(), shards,
        )  # fmt: skip
        return layout
    raise ConfigurationError(
        f"computation {computation!r} of app {app!r} was started with {layout.shards} shards "
        f"and is now configured with {shards}: a changed count would send keys to shards that "
        f"do not hold their state. Run `millstream rescale {app} {computation} --shards "
        f"{shards}` to move the keys (while the application runs or not), or configure "
        f"shards={layout.shards} again (its `shards` option or MILLSTREAM_SHARDS); to start "
        f"over instead, use a new app name or `millstream reset {app} --computation "
        f"{computation}`"
    )


def record_shard_count(client: RedisClient, app: str, computation: str, shards: int) -> None:
    """`record_layout` for callers that only need the check."""
    record_layout(client, app, computation, shards)


def request_rescale(client: RedisClient, app: str, computation: str, shards: int) -> None:
    if not 1 <= shards <= MAX_SHARDS:
        raise ConfigurationError(f"--shards must be between 1 and {MAX_SHARDS}, not {shards}")
    client.hset(rescale_requests_key(app), computation, shards)


def pending_rescales(client: RedisClient, app: str) -> dict[str, int]:
    raw = client.hgetall(rescale_requests_key(app))
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
