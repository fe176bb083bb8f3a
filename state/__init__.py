"""The state layer: atomic, lease-guarded per-shard commits in Redis.

See docs/design.md sections 4, 5, 6 and 8: the per-shard protocol, the exactly-once argument,
the Redis key layout and the low-watermark authority. Import from the modules themselves
(`millstream.state.shard`, `millstream.state.watermarks`, ...): this package imports nothing,
so a process that needs one light module (an injector's planner workers need the watermark
type) does not load Redis's client, numpy and the Bloom filters with it.
"""
