"""Options of the `millstream-kafka` data source: parsed and validated once, on the driver.

Spark hands options over lower-cased (its CaseInsensitiveDict), so names are matched without
case; messages use the documented camelCase spelling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from millstream.errors import ConfigurationError
from millstream.injectors._callables import load_callable
from millstream.settings import Settings, mask_url, validate_bootstrap, validate_redis_url

SHORT_NAME = "millstream-kafka"

# Documented name -> meaning; the error for an unknown option lists these.
OPTIONS: dict[str, str] = {
    "bootstrap.servers": "Kafka bootstrap servers, host:port[,host:port] (required)",
    "topics": "comma-separated input topics (required)",
    "stream": "stream name of the injected records (default: the first topic)",
    "startingOffsets": "earliest or latest, for a query without a checkpoint (default earliest)",
    "maxRecordsPerTrigger": "admission control: at most this many offsets per micro-batch",
    "idHeader": "take each record's id from this header",
    "idExtractor": "module:function(key, value, headers) -> bytes, the record id",
    "timestampExtractor": "module:function(key, value, headers) -> int, event time in ms",
    "kafka.*": "passed to librdkafka without the prefix, e.g. kafka.security.protocol",
    "redis.url": "publish the injector watermark to this Redis after each batch",
    "app": "application name: Redis key namespace of the watermark (default millstream)",
    "instance": "injector instance name for watermark publication (default: the stream)",
    "idleSlackMs": "idle partitions: watermark = now - this (default 2000)",
    "outageGraceMs": "after the broker was unreachable, hold the idle watermark this long (15000)",
    "maxFutureMs": "a record timestamped further ahead of the clock is an error row (86400000)",
    "tickMs": "run a (possibly empty) batch at least this often (default 1000)",
    "readTimeoutMs": "fail a task that waits longer than this for its records (default 120000)",
    "throttle": "true: admit nothing while the app's throttle pauses this stream (set by a join)",
    "startFile": "keep the first start positions in this local file (millstream run sets it in "
    "the query's checkpoint): a query restarted before its first batch committed reads the "
    "same records, even from latest",
}

# librdkafka settings the injector owns: offsets live in the Spark checkpoint, not in a group.
RESERVED_KAFKA = {
    "bootstrap.servers": "use the bootstrap.servers option",
    "group.id": "offsets live in the Spark checkpoint; no consumer group is used",
    "enable.auto.commit": "offsets live in the Spark checkpoint",
    "enable.auto.offset.store": "offsets live in the Spark checkpoint",
    "enable.partition.eof": "the injector needs partition EOF events to bound its reads",
    "auto.offset.reset": "a missing offset is data loss and fails the query",
}

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_APP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SECRET_WORDS = ("password", "secret", "token", "jaas", "key")

Extractor = Callable[[bytes | None, bytes | None, list[tuple[str, bytes | None]]], Any]


def is_secret(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def load_extractor(path: str, option: str) -> Extractor:
    """Import "module:function"; the module must be importable on the executors too."""
    return load_callable(path, option)


def _int(raw: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = raw.get(name.lower())
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ConfigurationError(
            f"option {name}={value!r} is invalid: expected an integer from {low} to {high}."
        )
    return number


@dataclass(frozen=True)
class KafkaInjectorOptions:
    """Validated options; picklable, because Spark ships the data source to every task."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    stream: str
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_records_per_trigger: int | None = None
    id_header: str | None = None
    id_extractor: str | None = None
    timestamp_extractor: str | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    app: str = "millstream"
    instance: str = ""
    idle_slack_ms: int = 2000
    outage_grace_ms: int = 15_000
    max_future_ms: int = 86_400_000
    tick_ms: int = 1000
    read_timeout_ms: int = 120_000
    throttle: bool = False
    start_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaInjectorOptions:
        """Validate every option; a mistake raises ConfigurationError naming it and the fix."""
        raw = {str(k).lower(): str(v) for k, v in options.items()}
        known = {name.lower() for name in OPTIONS if name != "kafka.*"}
        unknown = sorted(k for k in raw if k not in known and not k.startswith("kafka."))
        if unknown:
            raise ConfigurationError(
                f"unknown option {unknown[0]!r} for format {SHORT_NAME!r}: valid options are "
                + ", ".join(OPTIONS)
                + "."
            )
        servers = raw.get("bootstrap.servers", "").strip()
        if not servers:
            raise ConfigurationError(
                f"option bootstrap.servers is required by {SHORT_NAME!r}: "
                ".option('bootstrap.servers', 'host:9092')."
            )
        try:
            validate_bootstrap(servers)
        except ConfigurationError:
            raise ConfigurationError(
                f"option bootstrap.servers={servers!r} is invalid: expected host:port[,host:port]."
            ) from None
        topics = tuple(t.strip() for t in raw.get("topics", "").split(",") if t.strip())
        if not topics:
            raise ConfigurationError(
                f"option topics is required by {SHORT_NAME!r}: .option('topics', 'orders,refunds')."
            )
        for topic in topics:
            if not _TOPIC.match(topic):
                raise ConfigurationError(
                    f"option topics: {topic!r} is not a valid Kafka topic name "
                    "(1-249 letters, digits, '.', '_' or '-')."
                )
        if len(set(topics)) != len(topics):
            raise ConfigurationError(f"option topics={raw['topics']!r} names a topic twice.")
        stream = raw.get("stream", "").strip() or topics[0]
        starting = raw.get("startingoffsets", "earliest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise ConfigurationError(
                f"option startingOffsets={starting!r} is invalid: expected earliest or latest."
            )
        max_records = (
            _int(raw, "maxRecordsPerTrigger", 0, 1, 10**12)
            if "maxrecordspertrigger" in raw
            else None
        )
        id_header = raw.get("idheader") or None
        id_extractor = raw.get("idextractor") or None
        ts_extractor = raw.get("timestampextractor") or None
        if id_header and id_extractor:
            raise ConfigurationError(
                "options idHeader and idExtractor are exclusive: keep one of them."
            )
        for option, path in (("idExtractor", id_extractor), ("timestampExtractor", ts_extractor)):
            if path:
                load_extractor(path, option)
        kafka: dict[str, str] = {}
        for key, value in raw.items():
            if not key.startswith("kafka."):
                continue
            name = key.removeprefix("kafka.")
            if name in RESERVED_KAFKA:
                raise ConfigurationError(
                    f"option {key} is not allowed: {RESERVED_KAFKA[name]}; remove it."
                )
            kafka[name] = value
        isolation = kafka.get("isolation.level", "read_committed")
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(
                f"option kafka.isolation.level={isolation!r} is invalid: "
                "expected read_committed or read_uncommitted."
            )
        redis_url = raw.get("redis.url") or None
        if redis_url:
            try:
                validate_redis_url(redis_url)
            except ConfigurationError:
                raise ConfigurationError(
                    f"option redis.url={mask_url(redis_url)!r} is invalid: expected a URL like "
                    "redis://localhost:6379/0."
                ) from None
        throttle = raw.get("throttle", "false").strip().lower()
        if throttle not in ("true", "false"):
            raise ConfigurationError(f"option throttle={throttle!r} is invalid: true or false.")
        if throttle == "true" and not redis_url:
            raise ConfigurationError("option throttle=true needs redis.url (where the flag is).")
        app = raw.get("app", "millstream")
        if not _APP.match(app):
            raise ConfigurationError(
                f"option app={app!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'."
            )
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            stream=stream,
            starting_offsets="latest" if starting == "latest" else "earliest",
            max_records_per_trigger=max_records,
            id_header=id_header,
            id_extractor=id_extractor,
            timestamp_extractor=ts_extractor,
            kafka=kafka,
            redis_url=redis_url,
            app=app,
            instance=raw.get("instance", "").strip() or stream,
            idle_slack_ms=_int(raw, "idleSlackMs", 2000, 0, 30 * 86_400_000),
            outage_grace_ms=_int(raw, "outageGraceMs", 15_000, 0, 86_400_000),
            max_future_ms=_int(raw, "maxFutureMs", 86_400_000, 0, 10 * 365 * 86_400_000),
            tick_ms=_int(raw, "tickMs", 1000, 1, 86_400_000),
            read_timeout_ms=_int(raw, "readTimeoutMs", 120_000, 100, 86_400_000),
            throttle=throttle == "true",
            start_file=raw.get("startfile", "").strip() or None,
        )

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings: user pass-through first, then the settings the injector owns."""
        return {
            **self.kafka,
            "bootstrap.servers": self.bootstrap_servers,
            # librdkafka insists on a group.id for a consumer; nothing joins or commits with it.
            "group.id": f"millstream-injector-{self.stream}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Never resolve a bad offset silently: out of range is data loss (retention, a
            # recreated topic) and must fail the query.
            "auto.offset.reset": "error",
            **overrides,
        }

    def describe(self) -> dict[str, Any]:
        """A printable view with secrets masked."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "topics": ",".join(self.topics),
            "stream": self.stream,
            "redis.url": mask_url(self.redis_url),
            **{f"kafka.{k}": "***" if is_secret(k) else v for k, v in self.kafka.items()},
        }


def options_from_settings(
    settings: Settings, topics: str | list[str], **options: str | int
) -> dict[str, str]:
    """Data source options for `topics` from the one Settings object (env read elsewhere)."""
    out: dict[str, str] = {
        "bootstrap.servers": settings.kafka_config()["bootstrap.servers"],
        "topics": topics if isinstance(topics, str) else ",".join(topics),
        "app": settings.app,
        "idleSlackMs": str(settings.idle_slack_ms),
        "outageGraceMs": str(settings.outage_grace_ms),
        "maxRecordsPerTrigger": str(settings.max_records_per_batch),
    }
    if settings.redis_url:
        out["redis.url"] = settings.redis_url
    out.update({f"kafka.{k}": v for k, v in settings.kafka_extra.items()})
    out.update({k: str(v) for k, v in options.items()})
    return out
