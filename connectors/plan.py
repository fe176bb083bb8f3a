"""What the driver sends to every shard task of one micro-batch (picklable, small)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millstream.state.keys import shard_of as shard_of
from millstream.state.shard import ShardConfig
from millstream.state.watermarks import UNKNOWN, Watermark

if TYPE_CHECKING:  # connectors.delivery imports this module
    from millstream.connectors.delivery import Target


@dataclass(frozen=True)
class BatchPlan:
    app: str
    batch_id: int
    redis_url: str
    shards: int
    shard_config: ShardConfig
    input_watermark: Watermark
    gc_watermark: int
    now: int
    user_retries: int
    fail_stop: bool
    internal_inputs: frozenset[str]
    deliveries: Mapping[str, Sequence[Target]]  # stream -> its sinks (see connectors.delivery)
    in_flight_streams: frozenset[str]  # streams whose deliveries hold consumers' watermarks
    # Bad-input bounds (MILLSTREAM_MAX_RECORD_BYTES, MILLSTREAM_MAX_FUTURE_MS): a record beyond
    # them is dead-lettered, so per-key state stays bounded and no timestamp far ahead of the
    # clock opens windows or timers that would never close.
    max_record_bytes: int = 1 << 20
    max_future_ms: int = 86_400_000
    # The computation's published low watermark when the batch was planned: a watermark hold
    # set behind it could not be honoured (see Context.set_timer).
    output_watermark: int = UNKNOWN
    # Streams whose productions are handed to consumers inside the batch (connectors/fused.py):
    # a weak production on one is checkpointed like a strong one, since the hand-over comes
    # after the commit; weak productions on other streams are delivered before it.
    handed_streams: frozenset[str] = frozenset()
    # The input watermark once this batch's records are applied: the injectors' estimates at
    # the batch's end offsets (the value their commit publishes). Event timers up to it fire
    # after the records, in this batch, instead of waiting for the next one. None: no such
    # pass (an input another computation produces has no estimate before its commit).
    end_watermark: Watermark | None = None
    # The computation's shard layout generation (`state/shard_count.py`): which keys its
    # shards' state lives under.
    generation: int = 0


@dataclass(slots=True)
class TaskInput:
    """One routed row: the key (None when extraction failed) and why it cannot be processed.

    Made once per row in the driver and again in a Spark task: slotted, not frozen (a frozen
    dataclass costs about three times as much to build).

    `data`: the value decoded by its stream's format where routing decoded it (`decoded`), so
    the shard task does not decode it again.
    """

    key: str | None
    row: tuple
    error: str | None
    data: Any = None
    decoded: bool = False
