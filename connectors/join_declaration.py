"""`Topology.join`: the store computation and the joiner (`connectors/join_operator.py`),
declared with every check that can be made before anything runs."""

from __future__ import annotations

from typing import Any

from millstream.connectors.join_log import LookupTime, check_log
from millstream.connectors.join_operator import (
    Combine,
    EventStoreOperator,
    JoinOperator,
    JoinRetry,
    Lookup,
)
from millstream.errors import ConfigurationError


def declare_join(
    topology: Any,
    name: str,
    *,
    primary: str,
    primary_id: Lookup,
    secondary: str,
    secondary_id: Lookup,
    lookup: Lookup,
    combine: Combine,
    output: str,
    unjoined: str,
    registry: str,
    registry_url: str | None,
    retry: JoinRetry | None,
    cache_ttl_s: int,
    max_waiting: int | None,
    options: dict[str, Any],
    log_tier: Any = None,
    lookup_time: LookupTime | None = None,
) -> None:
    """`Topology.join`: the store computation, then the joiner (so a click and its query in
    one batch join at once: the store writes before the joiner looks)."""
    retry = retry or JoinRetry()
    if not isinstance(retry, JoinRetry):
        raise ConfigurationError(f"join {name!r}: retry must be a JoinRetry, got {retry!r}")
    retry.validate(name)
    for label, fn in (("primary_id", primary_id), ("secondary_id", secondary_id),
                      ("lookup", lookup), ("combine", combine)):  # fmt: skip
        if not callable(fn):
            raise ConfigurationError(f"join {name!r}: {label} must be callable, got {fn!r}")
    if not isinstance(cache_ttl_s, int) or isinstance(cache_ttl_s, bool) or cache_ttl_s < 1:
        raise ConfigurationError(f"join {name!r}: cache_ttl_s must be an int >= 1")
    if max_waiting is not None and (
        not isinstance(max_waiting, int) or isinstance(max_waiting, bool) or max_waiting < 1
    ):
        raise ConfigurationError(
            f"join {name!r}: max_waiting must be an int >= 1 (waiting clicks per shard) or None "
            f"(no bound), got {max_waiting!r}"
        )
    tier = check_log(name, log_tier, lookup_time)
    if output == unjoined:
        raise ConfigurationError(f"join {name!r}: output and unjoined must be two streams")
    if options.get("productions", "strong") != "strong" or options.get("exactly_once") is False:
        raise ConfigurationError(
            f"join {name!r}: a join runs exactly-once with strong productions (its output is "
            "registered before delivery)"
        )
    _check_registry(name, registry)
    store = f"{topology.app}:es:{name}"  # state/event_store.py: inside the app's prefix
    topology.computation(
        f"{name}-store", EventStoreOperator(store, cache_ttl_s), inputs={secondary: secondary_id},
        **{k: v for k, v in options.items() if k in ("shards",)},
    )  # fmt: skip
    joiner = JoinOperator(
        store=store, lookup=lookup, combine=combine, output=output, unjoined=unjoined,
        registry=registry, registry_url=registry_url, retry=retry, primary=primary,
        max_waiting=max_waiting, secondary=secondary, secondary_id=secondary_id,
        cache_ttl_s=cache_ttl_s, log_tier=tier, lookup_time=lookup_time,
    )  # fmt: skip
    topology.computation(
        name, joiner, inputs={primary: primary_id}, outputs=[output, unjoined], **options
    )


def _check_registry(join: str, registry: str) -> None:
    if not registry or any(c in registry for c in "{}:"):
        raise ConfigurationError(
            f"join {join!r}: registry name {registry!r} must be non-empty, without '{{', '}}' "
            "or ':'"
        )
