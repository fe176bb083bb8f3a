"""Private helpers shared by the Kafka sinks: headers, error classification, client caches.

Header encoding (what consumers of millstream topics can rely on):

- `ms-id`: the production id, raw bytes.
- `ms-system-time`, `ms-event-time`: milliseconds as a big-endian signed 64-bit integer
  (8 bytes). `decode_time_header` also accepts ASCII decimal, which older writers used.
- the production's own headers follow, in order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from millstream.errors import ConfigurationError, FencedError, MillstreamError, TransientError
from millstream.records import Production

_log = logging.getLogger(__name__)

HEADER_ID = "ms-id"
HEADER_SYSTEM_TIME = "ms-system-time"
HEADER_EVENT_TIME = "ms-event-time"

TopicFor = str | Mapping[str, str] | Callable[[str], str]

# librdkafka settings the sinks own: a user override would silently break the guarantees.
_OWNED = {"enable.idempotence", "acks", "transactional.id", "isolation.level"}

_FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}
_CONFIG_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "grant the principal Write and Describe on the topic",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: (
        "grant the principal Write and Describe on TransactionalId 'millstream.*'"
    ),
    KafkaError.GROUP_AUTHORIZATION_FAILED: (
        "grant the principal Read on consumer groups 'millstream.progress.*'"
    ),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "grant the principal IdempotentWrite on the cluster",
    KafkaError.UNKNOWN_TOPIC_OR_PART: "create the topic before starting the pipeline",
    KafkaError.MSG_SIZE_TOO_LARGE: (
        "raise the topic's max.message.bytes and the producer's message.max.bytes, "
        "or produce smaller values"
    ),
    KafkaError._UNKNOWN_TOPIC: "create the topic before starting the pipeline",
    KafkaError._UNKNOWN_PARTITION: "the topic has fewer partitions than expected: recreate it",
    KafkaError.UNSUPPORTED_VERSION: "use Apache Kafka 2.5 or newer (or a compatible broker)",
    KafkaError._UNSUPPORTED_FEATURE: "use Apache Kafka 2.5 or newer (or a compatible broker)",
    KafkaError.INVALID_TRANSACTION_TIMEOUT: (
        "lower transaction_timeout_ms below the broker's transaction.max.timeout.ms"
    ),
    KafkaError._INVALID_ARG: "fix the Kafka client settings",
}


def encode_time(ms: int) -> bytes:
    """A millisecond time as an 8-byte big-endian signed integer: fixed size, sorts bytewise."""
    return int(ms).to_bytes(8, "big", signed=True)


def decode_time_header(raw: bytes | None) -> int | None:
    """Read `ms-system-time` / `ms-event-time`: 8-byte big-endian, or ASCII decimal."""
    if raw is None:
        return None
    if len(raw) == 8:
        return int.from_bytes(raw, "big", signed=True)
    return int(raw.decode("ascii"))


def production_headers(production: Production) -> list[tuple[str, bytes]]:
    """The millstream headers first, then the production's own, in order."""
    return [
        (HEADER_ID, production.id),
        (HEADER_SYSTEM_TIME, encode_time(production.system_time)),
        (HEADER_EVENT_TIME, encode_time(production.timestamp)),
        *production.headers,
    ]


def resolve_topic(topic_for: TopicFor, stream: str) -> str:
    """Map a stream name to its topic: one topic, a dict, or a function of the stream name."""
    if isinstance(topic_for, str):
        return topic_for
    if isinstance(topic_for, Mapping):
        try:
            return topic_for[stream]
        except KeyError:
            raise ConfigurationError(
                f"no topic for stream {stream!r}: add it to the sink's topic mapping"
            ) from None
    topic = topic_for(stream)
    if not isinstance(topic, str) or not topic:
        raise ConfigurationError(f"topic_for({stream!r}) returned {topic!r}: expected a topic name")
    return topic


def static_topics(topic_for: TopicFor) -> list[str]:
    """Topics known before any delivery (a function of the stream is only known lazily)."""
    if isinstance(topic_for, str):
        return [topic_for]
    if isinstance(topic_for, Mapping):
        return sorted(set(topic_for.values()))
    return []


def client_config(
    base: Mapping[str, str], extra: Mapping[str, Any] | None, owned: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge user settings with the ones the sink must own; refuse conflicting overrides."""
    if "bootstrap.servers" not in base:
        raise ConfigurationError(
            "the sink's Kafka config has no bootstrap.servers: pass Settings.kafka_config()"
        )
    merged: dict[str, Any] = {**base, **(extra or {})}
    for name, value in owned.items():
        given = merged.get(name)
        if name in _OWNED and given is not None and str(given).lower() != str(value).lower():
            raise ConfigurationError(
                f"Kafka setting {name}={given!r} conflicts with the sink's guarantee "
                f"({name}={value!r}): remove it from the sink's config"
            )
        merged[name] = value
    return merged


def kafka_error(exc: BaseException | None) -> KafkaError | None:
    """The KafkaError behind an exception, if any; drops the tracebacks of the chain.

    confluent-kafka 2.16 can raise a fatal error (for example _FENCED) from `flush()` as a
    SystemError whose cause is the KafkaException, so the cause chain is searched too. That path
    leaks a reference to the exceptions: their tracebacks would keep our frames, and through them
    a fenced producer with its threads and sockets, alive for good. So they are cut here.
    """
    chain: list[BaseException] = []
    while exc is not None and len(chain) < 4:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for link in chain:
        if isinstance(link, KafkaException) and link.args and isinstance(link.args[0], KafkaError):
            for other in chain:
                other.__traceback__ = None
            return link.args[0]
    return None


def purge_quietly(producer: Any) -> None:
    """Drop what a producer still queues or has in flight, ignoring a broken handle.

    For a producer being given up (fenced, fatal, stuck): what it holds belongs to a failed
    delivery whose productions stay checkpointed. Not Producer.close(): on a fenced producer it
    blocks forever (confluent-kafka 2.16); dropping the last reference destroys the handle.
    """
    with contextlib.suppress(KafkaException, SystemError, RuntimeError):
        producer.purge(in_queue=True, in_flight=True, blocking=False)


def is_fenced(err: KafkaError | None) -> bool:
    return err is not None and err.code() in _FENCED_CODES


def classify(err: KafkaError, what: str) -> MillstreamError:
    """Turn a librdkafka error into the millstream error that says what the caller must do."""
    code = err.code()
    if code in _FENCED_CODES:
        return FencedError(
            f"{what}: Kafka fenced this producer ({err.name()}): another process initialised the "
            "same transactional.id; this one is a zombie and stops"
        )
    if code in _CONFIG_CODES:
        return ConfigurationError(f"{what}: {err.name()} ({err.str()}): {_CONFIG_CODES[code]}")
    return TransientError(f"{what}: {err.name()} ({err.str()}); retry later")


# librdkafka log lines and errors that mean "these security settings do not fit the listener".
_SECURITY_SIGNS = (
    "SSL_HANDSHAKE",
    "SSL handshake",
    "AUTH_HANDSHAKE",
    "AUTH_REQ",
    "SASL",
    "security.protocol",  # librdkafka's hint: "might be caused by incorrect security.protocol"
)
_SECURITY_CODES = {KafkaError._AUTHENTICATION, KafkaError._SSL}
_PROBE_SETUP_TIMEOUT_MS = 10_000
_SECRET_KEY_WORDS = ("password", "secret", "token", "jaas", "key")


def redact(text: str, config: Mapping[str, Any]) -> str:
    """`text` with the value of every secret-looking client setting replaced by ***."""
    for name, value in config.items():
        if any(w in name.lower() for w in _SECRET_KEY_WORDS) and isinstance(value, str) and value:
            text = text.replace(value, "***")
    return text


class _Watch:
    """Collects librdkafka errors and log lines of one client, served by its `poll()`."""

    def __init__(self) -> None:
        self.errors: list[KafkaError] = []
        self.lines: list[str] = []

    def error(self, err: KafkaError) -> None:
        self.errors.append(err)

    def log(self, level: int, fmt: str, *args: Any) -> None:  # the `logger` protocol
        line = fmt % args if args else fmt
        self.lines.append(line)
        _log.log(max(level, logging.DEBUG), "librdkafka: %s", line)

    def security_problem(self) -> str | None:
        for err in self.errors:
            if err.code() in _SECURITY_CODES:
                return str(err.str())
        for line in self.lines:
            if "FAIL" in line and any(sign in line for sign in _SECURITY_SIGNS):
                return line.split("]: ", 1)[-1]
        return None


def admin_metadata(config: Mapping[str, Any], timeout: float) -> tuple[AdminClient, Any]:
    """An AdminClient for `config` and the cluster metadata, failing fast on security mistakes.

    librdkafka keeps retrying a TLS or SASL handshake that cannot succeed (TLS against a
    plaintext listener, a wrong SASL mechanism, bad credentials) and reports a bare "transport
    failure" when the timeout ends. Its logs and error callback name the real cause much
    earlier; this raises ConfigurationError with it (secrets redacted) as soon as it appears.
    Raises KafkaException when the broker does not answer within `timeout` for another reason.

    For start-up checks (`ensure_topics`) only: a broker restarting mid-handshake would read as
    a security mistake too, so clients that must ride out broker restarts do not use this.
    """
    watch = _Watch()
    settings: dict[str, Any] = {
        "socket.connection.setup.timeout.ms": _PROBE_SETUP_TIMEOUT_MS,
        **config,
        "error_cb": watch.error,
        "logger": watch,
    }
    where = f"Kafka at {config.get('bootstrap.servers')}"
    try:
        admin = AdminClient(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid Kafka client settings for {where} ({redact(str(exc), config)}): fix the "
            "MILLSTREAM_KAFKA_* variables"
        ) from None
    deadline = time.monotonic() + timeout
    wait = 1.0  # grows to 5 s: a big cluster's metadata may take longer than the first slice
    while True:
        try:
            return admin, admin.list_topics(
                timeout=min(wait, max(0.05, deadline - time.monotonic()))
            )
        except KafkaException:
            wait = min(wait * 2, 5.0)
            admin.poll(0)  # serves the error callback and the log lines
            problem = watch.security_problem()
            if problem is not None:
                protocol = config.get("security.protocol", "plaintext")
                raise ConfigurationError(
                    f"{where}: the TLS/SASL handshake failed ({redact(problem, config)}) with "
                    f"security.protocol={protocol}: set MILLSTREAM_KAFKA_SECURITY_PROTOCOL (and the "
                    "ssl.* / sasl.* settings) to what the broker's listener expects"
                ) from None
            if time.monotonic() >= deadline:
                raise


def check_topics(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float
) -> dict[str, int]:
    """Partition count per topic; ConfigurationError when one is missing or not authorised.

    `config` is the connection part only (bootstrap servers and security), not producer tuning.

    Topics must exist beforehand: some brokers (Tansu) auto-create a missing topic with default
    settings on first produce, which hides a typo and picks the wrong partition count.
    """
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = AdminClient(dict(config))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TransientError(
            f"Kafka at {config.get('bootstrap.servers')} did not answer a metadata request "
            f"within {timeout:.0f}s ({exc}): check the bootstrap servers and that the broker runs"
        ) from None
    counts: dict[str, int] = {}
    for topic in wanted:
        meta = metadata.topics.get(topic)
        if meta is None:
            raise ConfigurationError(
                f"topic {topic!r} does not exist on {config.get('bootstrap.servers')}: create it "
                "(for example `kafka-topics.sh --create --topic "
                f"{topic} --partitions N`) before starting the pipeline"
            )
        if meta.error is not None:
            raise classify(meta.error, f"topic {topic!r}")
        counts[topic] = len(meta.partitions)
    return counts


V = TypeVar("V")


class ProcessCache(Generic[V]):
    """Clients cached per Python process: Spark reuses worker processes across batches.

    A forked child must not reuse its parent's librdkafka handle, so entries are keyed by pid.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[int, Any], V] = {}

    def get(self, key: Any) -> V | None:
        with self._lock:
            return self._items.get((os.getpid(), key))

    def put(self, key: Any, value: V) -> V:
        with self._lock:
            return self._items.setdefault((os.getpid(), key), value)

    def pop(self, key: Any) -> V | None:
        with self._lock:
            return self._items.pop((os.getpid(), key), None)

    def drain(self, match: Callable[[Any], bool]) -> list[V]:
        """Remove and return this process's entries whose key matches."""
        pid = os.getpid()
        with self._lock:
            keys = [k for k in self._items if k[0] == pid and match(k[1])]
            return [self._items.pop(k) for k in keys]


class Deadline:
    """A monotonic deadline: every retry loop in the sinks is bounded by one."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end
