"""What `millstream status` shows: per computation watermarks, lag, throughput and backlog."""

from __future__ import annotations

import json
from typing import Any

from millstream.state import replay
from millstream.state.keys import INJECTOR_EVENTS, ShardKeys, app_key
from millstream.state.shard_count import ShardLayout, pending_rescales, read_layout
from millstream.state.watermarks import INFINITY, UNKNOWN, WatermarkAuthority, now_ms

# Upper bounds (seconds) of the batch duration histogram: a batch costs 0.1 s to minutes.
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def computations_of(client: Any, app: str) -> list[str]:
    prefix = app_key(app, "metrics", "")
    names = [k.decode()[len(prefix) :] for k in client.scan_iter(match=prefix + "*", count=1000)]
    return sorted(names)


def committed_counters(
    client: Any, app: str, computation: str, shards: int | None = None
) -> dict[str, int]:
    """A computation's counters summed over its shards, as committed with their effects.

    Exact after any crash, unlike the driver's metrics hash: the driver adds a batch's counts
    after the batch, so a crash between the shards' commits and that update loses them (the
    replay then sees only replays). The shards are the recorded layout's (a rescale moves the
    counters with the keys); `shards` is for a computation with none recorded.
    """
    layout = _layout(client, app, computation, shards)
    count = layout.shards
    pipe = client.pipeline(transaction=False)
    for keys in layout.keys(app, computation):
        pipe.hgetall(keys.counters)
    total: dict[str, int] = {}
    for counters in pipe.execute() if count else []:
        for name, value in counters.items():
            key = name.decode() if isinstance(name, bytes) else str(name)
            total[key] = total.get(key, 0) + int(value)
    return total


def injector_events(client: Any, app: str) -> dict[str, dict[str, int]]:
    """Per injected stream, what its injector counted (the log-file injector's rotations:
    copytruncated, rotated_unseen, lost), summed over its instances."""
    prefix = app_key(app, INJECTOR_EVENTS, "")
    out: dict[str, dict[str, int]] = {}
    for raw in sorted(client.scan_iter(match=prefix + "*", count=1000)):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        totals: dict[str, int] = {}
        for field, value in client.hgetall(key).items():
            name = (field.decode() if isinstance(field, bytes) else str(field)).rsplit("|", 1)[-1]
            totals[name] = totals.get(name, 0) + int(value)
        out[key[len(prefix) :]] = totals
    return out


def status(client: Any, app: str) -> dict[str, Any]:
    """A JSON-able snapshot; never includes URLs or credentials."""
    authority = WatermarkAuthority(client, app)
    now = now_ms()
    out: dict[str, Any] = {"app": app, "at": now, "computations": {}}
    out["injectors"] = injector_events(client, app)
    # Dead letters queued by `millstream dead-letters --replay`, not applied yet.
    out["replays_queued"] = replay.queued(client, app)
    requested = pending_rescales(client, app)
    for name in computations_of(client, app):
        metrics = {
            k.decode(): v.decode() for k, v in client.hgetall(app_key(app, "metrics", name)).items()
        }
        last = json.loads(metrics.pop("last_batch", "{}"))
        layout = _layout(client, app, name)
        shards = layout.shards
        if shards:  # the shards' committed counters are exact; the driver's may trail a crash
            metrics.update(
                {k: str(v) for k, v in committed_counters(client, app, name, shards).items()}
            )
        pipe = client.pipeline(transaction=False)
        for keys in layout.keys(app, name):
            pipe.hlen(keys.productions)
            pipe.zcard(keys.timers("event"))
            pipe.zcard(keys.timers("wall"))
        counts = pipe.execute() if shards else []
        wm = authority.published(name)
        low = wm.event if wm else None
        out["computations"][name] = {
            "low_watermark": low,
            "lag_ms": (now - low) if low is not None and UNKNOWN < low < INFINITY else None,
            "p99_watermark": last.get("p99_watermark"),
            "last_batch_seconds": last.get("seconds"),
            "batches": int(metrics.get("batches", 0)),
            "records": int(metrics.get("records", 0)),
            "duplicates_dropped": int(metrics.get("duplicates", 0))
            + int(metrics.get("remnants", 0)),
            "late_records": int(metrics.get("late", 0)),
            "late_by_stream": {
                k.split(":", 1)[1]: int(v) for k, v in metrics.items() if k.startswith("late:")
            },
            "dead_letters": int(metrics.get("dead_letters", 0)),
            "catalog_lookups_avoided": int(metrics.get("lookups_avoided", 0)),
            "catalog_reads": int(metrics.get("catalog_reads", 0)),
            # records whose ids are their Kafka position, decided by offset marks, no catalog
            "deduplicated_by_offset": int(metrics.get("offset_marked", 0)),
            "pending_productions": sum(counts[0::3]),
            # Set while the computation takes no new input because a target is down or slow.
            "backpressure_since": json.loads(metrics["backpressure"])["since"]
            if "backpressure" in metrics
            else None,
            "backpressure_seconds": float(metrics.get("backpressure_seconds", 0)),
            "timers_pending": sum(counts[1::3]) + sum(counts[2::3]),
            "shards": shards,
            "layout_generation": layout.generation,  # how many rescales it went through
            "rescale_requested": requested.get(name),  # a count not applied yet
            "batch_seconds": batch_seconds_histogram(metrics),
        }
    return out


def record_batch_seconds(pipe: Any, metrics_key: str, seconds: float) -> None:
    """Add one batch's duration to the histogram in a computation's metrics hash.

    For the runtime, in the pipeline of its per-batch metrics update: a histogram needs every
    batch, which a scrape of `last_batch` cannot see. Buckets are cumulative, as Prometheus's.
    """
    for bound in BATCH_SECONDS_BUCKETS:
        if seconds <= bound:
            pipe.hincrby(metrics_key, f"batch_seconds_le_{bound:g}", 1)
    pipe.hincrby(metrics_key, "batch_seconds_count", 1)
    pipe.hincrbyfloat(metrics_key, "batch_seconds_sum", round(seconds, 6))


def batch_seconds_histogram(metrics: dict[str, str]) -> dict[str, Any] | None:
    """The histogram `record_batch_seconds` wrote, from a decoded metrics hash; None if none."""
    if "batch_seconds_count" not in metrics:
        return None
    return {
        "buckets": [
            [bound, int(metrics.get(f"batch_seconds_le_{bound:g}", 0))]
            for bound in BATCH_SECONDS_BUCKETS
        ],
        "count": int(metrics["batch_seconds_count"]),
        "sum": float(metrics.get("batch_seconds_sum", 0.0)),
    }


def _layout(client: Any, app: str, name: str, shards: int | None = None) -> ShardLayout:
    """The recorded layout; else `shards`, else as many generation-0 shards as exist."""
    recorded = read_layout(client, app, name)
    if recorded is not None:
        return recorded
    return ShardLayout(_shard_count(client, app, name) if shards is None else shards)


def _shard_count(client: Any, app: str, name: str) -> int:
    shards = 0
    while client.exists(ShardKeys(app, name, shards).sequencer):
        shards += 1
    return shards
