"""Redis connections: one client per URL per process, single node or Cluster, with bounded retries."""

from __future__ import annotations

import ssl
import threading
from urllib.parse import parse_qs, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.retry import Retry

from millstream.errors import ConfigurationError, MillstreamError, TransientError
from millstream.settings import mask_url

# What `connect` returns: a single-node client or a Cluster client. Both
# speak every command the state layer uses, pipelines and WATCH/MULTI/EXEC included.
RedisClient = redis.Redis | RedisCluster
RedisPipeline = redis.client.Pipeline | ClusterPipeline
# Replies are bytes (`connect` never sets decode_responses); redis-py types them as
# `bytes | str` because a client may decode, so readers narrow them with `typing.cast`.

_CLIENTS: dict[str, RedisClient] = {}
_LOCK = threading.Lock()
_RETRIABLE = (redis.ConnectionError, redis.TimeoutError)
# What a Redis or Redis Cluster call can raise when the server is away or moving (a restart,
# a failover): redis-py's cluster errors such as SlotNotCoveredError are not RedisErrors.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.RedisError,
    redis.exceptions.RedisClusterException,
)


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
        tls = _tls_problem(url, exc)
        if tls is not None:
            raise tls from None
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


_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 6:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _tls_problem(url: str, exc: BaseException) -> MillstreamError | None:
    """A TLS mistake behind a connection error, as an error that names the cause and the fix.

    redis-py reports every one of them as a ConnectionError or TimeoutError, which would
    otherwise read as "unreachable" and be retried as if the server were down.
    """
    parts = urlsplit(url)
    where = f"Redis at {mask_url(url)}"
    causes = _causes(exc)
    if parts.scheme != "rediss":
        if any(isinstance(c, ConnectionResetError) for c in causes):
            return TransientError(  # maybe a TLS-only port, maybe not: say both
                f"{where} reset the connection ({exc}); a server that only accepts TLS does "
                "that to plaintext clients: then use a rediss:// URL (with ?ssl_ca_certs=/path/ca.pem)"
            )
        return None
    query = parse_qs(parts.query)
    ca = query.get("ssl_ca_certs", [""])[0]
    for cause in causes:
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = cause.verify_message or cause.reason or str(cause)
            trusted = f"ssl_ca_certs={ca}" if ca else "the system CA store (no ssl_ca_certs)"
            return ConfigurationError(
                f"{where}: TLS certificate verification failed ({reason}), trusting {trusted}: "
                "set ?ssl_ca_certs=/path/ca.pem in REDIS_URL to the CA that signed the server's "
                "certificate, and connect by a host name or IP address the certificate lists"
            )
        if isinstance(cause, FileNotFoundError | IsADirectoryError | PermissionError) or (
            isinstance(cause, ssl.SSLError) and "PEM" in str(cause)
        ):
            files = ", ".join(f"{k}={v[0]}" for k, v in query.items() if k in _TLS_FILES)
            return ConfigurationError(
                f"{where}: cannot load a TLS file of REDIS_URL ({cause}; {files or 'none given'}): "
                "point ssl_ca_certs (and ssl_certfile / ssl_keyfile, if used) at readable PEM files"
            )
        if isinstance(cause, ssl.SSLError):
            return ConfigurationError(
                f"{where}: TLS handshake failed ({cause}): check that this port serves TLS "
                "(use redis:// for a plaintext port) and the ssl_* parameters of REDIS_URL"
            )
        if isinstance(cause, TimeoutError) and "handshake" in str(cause):
            return ConfigurationError(
                f"{where}: the TLS handshake timed out: the server does not seem to speak TLS "
                "on this port (use redis:// for a plaintext port), or it is overloaded"
            )
    return None


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)
