"""A join's event-store log tier (Photon): where the joiner looks once the cache cannot hold a
query any more, and when.

The cache tier (`state/event_store.py`) keeps each query `cache_ttl_s` after the store
computation wrote it. A click whose query misses there is either early (the query has not
come: it waits and retries, `JoinRetry`) or late (the query came and expired). The joiner
cannot tell which from the cache, so it asks the clock: a miss for a query time (`lookup_time`
of the click, else the click's own time: queries precede their clicks) at or before
`now - cache_ttl_s` is looked for in the secondary stream's Kafka topics, `window_ms` either
side of that time (`injectors/event_log.py`), all of a shard batch's such clicks in one
search. A query found there is joined exactly as a cache hit (the same combine, checkpoint,
commit and registry gate), and put back in the cache for the clicks that follow it.

Exactly-once is the cache path's argument unchanged. The search only reads; what it finds
decides whether a click is joined in this shard's commit or waits, and that commit is atomic
under the shard's lease with the click's record id. A re-run of the batch (Spark's retry, a
restart) searches again and may decide otherwise, as a cache look-up may (a query written or
expired in between); only one run's commit applies (dedup and fencing, docs/design.md
section 5), and the registry gate keeps at most one output per click across pipelines. The
cache put is idempotent in effect (the same id, the same bytes), as the store's own is.

The topics are the secondary stream's Kafka sources, bound at start (`bind`) with the
application's broker settings. A secondary stream without one (a log file, or a stream a
computation produces) has no log tier: a WARNING at start says so.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millstream.errors import ConfigurationError, MillstreamError
from millstream.injectors.sources import KAFKA_FORMAT
from millstream.records import Record

if TYPE_CHECKING:
    from millstream.connectors.key_runner import KeyRunner
    from millstream.connectors.topology import Topology
    from millstream.injectors.event_log import SourceOptions

log = logging.getLogger(__name__)
LookupTime = Callable[[Record], int]


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class JoinLog:
    """The log tier's reach: events stamped within `window_ms` of the query time are found;
    one search (a shard batch's) reads at most `max_records` records and `max_bytes` bytes of
    keys and values, and reports a cut (`log_truncated`): those clicks wait and look again."""

    window_ms: int = 300_000
    max_records: int = 100_000
    max_bytes: int = 64 << 20

    def validate(self, join: str) -> None:
        """Each bound an int >= 1, or a ConfigurationError naming it."""
        for name in ("window_ms", "max_records", "max_bytes"):
            value = getattr(self, name)
            if not _positive(value):
                raise ConfigurationError(
                    f"join {join!r}: log {name} must be an int >= 1, got {value!r}"
                )


DEFAULT_LOG = JoinLog()


def check_log(join: str, log_tier: Any, lookup_time: Any) -> JoinLog | None:
    """The declaration's `log` (a JoinLog, or None: no log tier) and `lookup_time` checked."""
    if log_tier is not None:
        if not isinstance(log_tier, JoinLog):
            raise ConfigurationError(
                f"join {join!r}: log must be a JoinLog(window_ms=, max_records=, max_bytes=) "
                f"or None (no log tier), got {log_tier!r}"
            )
        log_tier.validate(join)
    if lookup_time is not None and not callable(lookup_time):
        raise ConfigurationError(
            f"join {join!r}: lookup_time must be callable (click record -> the query's time in "
            f"ms) or None (the click's own time), got {lookup_time!r}"
        )
    if lookup_time is not None and log_tier is None:
        raise ConfigurationError(
            f"join {join!r}: lookup_time is only used by the log tier, and log=None turns it off"
        )
    return log_tier


def log_sources(
    topology: Topology, secondary: str, settings_options: Mapping[str, str]
) -> tuple[SourceOptions, ...]:
    """The secondary stream's Kafka sources as a search reads them: each source's options with
    the application's broker connection (`settings_options`, as its injector gets them)."""
    from millstream.injectors.event_log import source_options

    return tuple(
        source_options({**src.options, **settings_options})
        for src in topology.sources.get(secondary, ())
        if src.format == KAFKA_FORMAT
    )


def bind(operator: Any, sources: tuple[SourceOptions, ...]) -> Any:
    """A copy of a joiner that searches `sources` (the operator travels to executors with them)."""
    bound = copy.copy(operator)
    bound.log_sources = sources
    return bound


def query_time(lookup_time: LookupTime | None, click: Record) -> int:
    """When the click's query happened, about: `lookup_time`, else the click's own time."""
    if lookup_time is None:
        return click.timestamp
    at = lookup_time(click)
    if isinstance(at, bool) or not isinstance(at, int):
        raise TypeError(f"lookup_time returned {type(at).__name__}, expected int ms")
    return at


@dataclass(frozen=True)
class LogLookup:
    """What one joiner needs to search: its tier, topics, id function and cache."""

    tier: JoinLog
    sources: tuple[SourceOptions, ...]
    secondary_id: Callable[[bytes | None, bytes], str]
    store: str
    cache_ttl_s: int


def look_in_log(
    runner: KeyRunner, lookup: LogLookup, misses: Mapping[str, tuple[str, int]]
) -> dict[str, bytes]:
    """Click -> query value for the cache `misses` (click -> (query id, query time)) whose
    query the cache can no longer hold, found in the log; one search for all of them."""
    horizon = runner.plan.now - lookup.cache_ttl_s * 1000
    old = {click: qt for click, qt in misses.items() if qt[1] <= horizon}
    if not old:
        return {}
    # librdkafka, Arrow and Redis only where a search runs: `Topology` imports this module.
    from confluent_kafka import KafkaException

    from millstream.injectors import event_log
    from millstream.state import event_store
    from millstream.state.client import connect

    window = lookup.tier.window_ms
    wants: dict[str, list[tuple[int, int]]] = {}
    for query, at in old.values():
        wants.setdefault(query, []).append((at - window, at + window))
    runner.count("log_lookups", len(old))
    runner.count("log_searches")
    try:
        result = event_log.search(
            lookup.sources, lookup.secondary_id, wants,
            max_records=lookup.tier.max_records, max_bytes=lookup.tier.max_bytes,
        )  # fmt: skip
    except (MillstreamError, KafkaException) as exc:
        # The clicks wait and look again at their next retry; the cache path goes on.
        log.warning("join log tier: search of %s failed: %s",
                    event_log.describe_sources(lookup.sources), exc)  # fmt: skip
        runner.count("log_failures")
        return {}
    runner.count("log_scanned", result.scanned)
    runner.count("log_scanned_bytes", result.bytes)
    if result.truncated:
        runner.count("log_truncated")
    joined = {click: result.found[q] for click, (q, _) in old.items() if q in result.found}
    runner.count("log_found", len(joined))
    log.info("join log tier: %d clicks, %d queries looked for in %s: %s", len(old), len(wants),
             event_log.describe_sources(lookup.sources), result.describe())  # fmt: skip
    if result.found:
        event_store.put(connect(runner.plan.redis_url), lookup.store,
                        sorted(result.found.items()), lookup.cache_ttl_s)  # fmt: skip
    return joined
