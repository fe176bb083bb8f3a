"""The state layer: atomic, lease-guarded per-shard commits in Redis.

See docs/design.md sections 4, 5, 6 and 8: the per-shard protocol, the exactly-once argument,
the Redis key layout and the low-watermark authority.
"""

from millstream.state.bloom import BloomFilter, BucketedBloom
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.lease import Lease, acquire
from millstream.state.shard import ShardStore, SoftStateCache
from millstream.state.transaction import ShardTransaction, TransactionStatus
from millstream.state.watermarks import Watermark, WatermarkAuthority

__all__ = [
    "BloomFilter",
    "BucketedBloom",
    "Lease",
    "ShardKeys",
    "ShardStore",
    "ShardTransaction",
    "SoftStateCache",
    "TransactionStatus",
    "Watermark",
    "WatermarkAuthority",
    "acquire",
    "connect",
]
