"""Redis key layout: everything of one (app, computation, shard) shares one hash tag.

One MULTI/EXEC then touches one Redis Cluster slot, so the design runs on Cluster unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import mmh3


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """`generation`: the computation's shard layout (`state/shard_count.py`); a rescale writes
    the next layout's shards under new keys, so the old ones stay whole until the switch."""

    app: str
    computation: str
    shard: int
    generation: int = 0

    @property
    def tag(self) -> str:
        if self.generation:
            return f"ms:{{{self.app}:{self.computation}:{self.shard}@{self.generation}}}"
        return f"ms:{{{self.app}:{self.computation}:{self.shard}}}"

    @property
    def sequencer(self) -> str:
        """The lease: INCR makes a new token current; commits check it."""
        return f"{self.tag}:seq"

    @property
    def version(self) -> str:
        """Count of commits; a worker whose soft state has this version is current."""
        return f"{self.tag}:ver"

    @property
    def state(self) -> str:
        return f"{self.tag}:state"

    def timers(self, domain: str) -> str:
        return f"{self.tag}:timers:{domain}"

    @property
    def timer_holds(self) -> str:
        """Sorted set timer member -> hold: event timers that hold the low watermark earlier
        than their time (the minimum is the shard's oldest work)."""
        return f"{self.tag}:timers:hold"

    def catalog(self, bucket: int) -> str:
        """A bucket's record id -> position, as versions before packed entries kept it:
        still read (and dropped by GC) where an upgraded application has one."""
        return f"{self.tag}:cat:{bucket}"

    def catalog_groups(self, bucket: int) -> str:
        """Hash group -> packed catalog entries (`catalog_entries.py`), for a bucket's groups
        still small; a group that grew moves to its own string, `catalog_group`."""
        return f"{self.tag}:catp:{bucket}"

    def catalog_group(self, bucket: int, group: int) -> str:
        return f"{self.tag}:catp:{bucket}:{group}"

    @property
    def buckets(self) -> str:
        """Sorted set of live catalog buckets (score: the bucket; member "p<bucket>" for packed
        entries, "<bucket>" for a legacy hash), for garbage collection of whole buckets."""
        return f"{self.tag}:buckets"

    @property
    def offset_marks(self) -> str:
        """Hash partition prefix -> next offset and time: what the shard applied of records
        whose ids are their Kafka position (`offset_marks.py`), instead of catalog entries."""
        return f"{self.tag}:marks"

    @property
    def commit_log(self) -> str:
        """Hash version -> ids and keys a commit wrote: lets other workers sync soft state cheaply."""
        return f"{self.tag}:log"

    @property
    def last_batch(self) -> str:
        """The micro-batch id of the shard's last commit of a batch's effects: tells a fenced
        zombie of an older batch from a task of the current one."""
        return f"{self.tag}:batch"

    @property
    def productions(self) -> str:
        """Hash production id -> checkpointed production awaiting delivery."""
        return f"{self.tag}:prod"

    @property
    def production_times(self) -> str:
        """Sorted set holding the earliest event time of the pending productions (one member,
        `transaction.HOLD`; one per production as written before 2026-12-07)."""
        return f"{self.tag}:prodts"

    @property
    def production_system_times(self) -> str:
        """Sorted set holding the earliest system (checkpoint) time of the pending productions,
        as `production_times` does: holds downstream catalog GC."""
        return f"{self.tag}:prodsys"

    @property
    def production_seq(self) -> str:
        return f"{self.tag}:prodseq"

    @property
    def counters(self) -> str:
        """Hash of per-shard metrics (records, duplicates, late, ...), updated in commits."""
        return f"{self.tag}:metrics"


def shard_of(key: str, shards: int) -> int:
    """A key's shard among `shards`: stable across processes (Python's hash() is salted per
    process). Rescaling (`state/rescale.py`) moves keys by the same function."""
    return mmh3.hash(key.encode("utf-8", "surrogatepass"), 0x4D5) % shards


# An injector's counters per stream (`app_key(app, INJECTOR_EVENTS, stream)`): what the log-file
# injector's rotation handling did, shown by `millstream status`.
INJECTOR_EVENTS = "injector-events"


def app_key(app: str, *parts: str) -> str:
    """Keys of the application (watermark authority, registry); tagged per app."""
    return ":".join((f"ms:{{{app}}}", *parts))
