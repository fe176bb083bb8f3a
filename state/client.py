"""Redis connections: one client per URL per process, single node or Cluster, with bounded retries."""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from millstream.errors import ConfigurationError, TransientError
from millstream.settings import mask_url

RedisClient = Any  # redis.Redis | RedisCluster: both speak the commands we use.

_CLIENTS: dict[str, RedisClient] = {}
_LOCK = threading.Lock()
_RETRIABLE = (redis.ConnectionError, redis.TimeoutError)


def _retry() -> Retry:
    # Connection-level failures only; WatchError (a moved lease) is never retried here.
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5, supported_errors=_RETRIABLE)


def connect(url: str, *, cached: bool = True) -> RedisClient:
    """Return a client for `url`; Redis Cluster is detected by asking the server.

    Cached per process so Spark's reused Python workers open one connection pool, not one per batch.
    """
    if cached:
        with _LOCK:
            client = _CLIENTS.get(url)
            if client is not None:
                return client
    client = _open(url)
    if cached:
        with _LOCK:
            _CLIENTS.setdefault(url, client)
            return _CLIENTS[url]
    return client


def _open(url: str) -> RedisClient:
    try:
        probe = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        try:
            info = probe.info("cluster")
        finally:
            probe.close()
    except redis.AuthenticationError as exc:
        raise ConfigurationError(
            f"Redis at {mask_url(url)} rejected the credentials: {exc}"
        ) from None
    except _RETRIABLE as exc:
        raise TransientError(
            f"Redis at {mask_url(url)} is unreachable ({exc}); check REDIS_URL and that the server runs."
        ) from None
    except redis.ResponseError as exc:  # e.g. an ACL user without INFO: assume single node
        if "NOPERM" not in str(exc):
            raise
        info = {}
    if info.get("cluster_enabled"):
        return RedisCluster.from_url(url, retry=_retry(), socket_timeout=10)
    return redis.Redis.from_url(url, retry=_retry(), socket_timeout=10, health_check_interval=30)


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


def reset_clients() -> None:
    """Forget cached clients (tests that restart Redis on a new port)."""
    with _LOCK:
        for client in _CLIENTS.values():
            client.close()
        _CLIENTS.clear()
