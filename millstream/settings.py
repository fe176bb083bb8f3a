"""Settings: read from the environment in exactly one place, validated at start-up."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from millstream.errors import ConfigurationError

T = TypeVar("T")

DEFAULT_APP = "millstream"
# Spark's driver JVM in a pipeline: C1 only, serial collector (MILLSTREAM_DRIVER_JAVA_OPTIONS).
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# (variable, default shown in the README, meaning); the README table is checked against this.
VARIABLES: tuple[tuple[str, str, str], ...] = (
    (
        "KAFKA_BOOTSTRAP_SERVERS",
        "(required by run)",
        "Kafka bootstrap servers, host:port[,host:port]. Unset: see MILLSTREAM_EMBEDDED.",
    ),
    (
        "REDIS_URL",
        "(required by run)",
        "Redis URL: redis://, rediss:// (TLS) or unix://. Unset: see MILLSTREAM_EMBEDDED.",
    ),
    (
        "MILLSTREAM_APP",
        DEFAULT_APP,
        "Application name the CLI's tools (status, state, reset, dead-letters) look at; "
        "`millstream run` uses the name its Topology gives.",
    ),
    ("MILLSTREAM_SPARK_MASTER", "local[2]", "Spark master URL."),
    (
        "MILLSTREAM_SPARK_DRIVER_MEMORY",
        "1g",
        "Heap of Spark's driver JVM (spark.driver.memory: 512m or more, e.g. 768m, 2g); in "
        "local mode the executors share it.",
    ),
    (
        "MILLSTREAM_DRIVER_JAVA_OPTIONS",
        DRIVER_JAVA_OPTIONS,
        "Options of Spark's driver JVM (space-separated, each starting with '-'; empty for the "
        "JVM's own defaults). The default compiles with C1 only and collects with the serial "
        "collector: in a pipeline the driver JVM schedules and moves little data; on a 2-core "
        "machine C2's compiler threads took a fifth of a core, and G1 kept 100-180 MB more "
        "resident (README, Spark's driver JVM). The heap is MILLSTREAM_SPARK_DRIVER_MEMORY's.",
    ),
    (
        "MILLSTREAM_CHECKPOINT_DIR",
        ".millstream/checkpoints",
        "Spark streaming checkpoints. A local folder's checkpoint files are renamed through "
        "Hadoop's FileSystem API (one rename(2) each); a distributed one (hdfs://, s3a://) "
        "keeps Spark's default manager.",
    ),
    ("MILLSTREAM_SHARDS", "8", "Default shard (key interval) count per computation, 1-4096."),
    ("MILLSTREAM_TRIGGER_MS", "200", "Micro-batch trigger interval in milliseconds."),
    ("MILLSTREAM_MAX_RECORDS_PER_BATCH", "200000", "Admission control: records per batch."),
    (
        "MILLSTREAM_MAX_PENDING_PRODUCTIONS",
        "100000",
        "Backpressure: undelivered productions per shard before input pauses.",
    ),
    ("MILLSTREAM_BUCKET_SECONDS", "600", "Record-id catalog bucket width (system time)."),
    (
        "MILLSTREAM_GC_SLACK_SECONDS",
        "3600",
        "Late-arrival slack before catalog buckets are dropped.",
    ),
    ("MILLSTREAM_BLOOM_EXPECTED", "200000", "Expected record ids per shard and bucket."),
    ("MILLSTREAM_BLOOM_FP_RATE", "0.001", "Target Bloom filter false-positive rate."),
    (
        "MILLSTREAM_IDLE_SLACK_MS",
        "2000",
        "Idle Kafka partitions: watermark follows now minus this.",
    ),
    (
        "MILLSTREAM_OUTAGE_GRACE_MS",
        "15000",
        "After Kafka was unreachable, idle partitions' watermark holds this long (0: off).",
    ),
    ("MILLSTREAM_USER_RETRIES", "3", "Retries of user code before a record is dead-lettered."),
    (
        "MILLSTREAM_MAX_RECORD_BYTES",
        "1048576",
        "Records with larger key plus value are dead-lettered.",
    ),
    (
        "MILLSTREAM_MAX_FUTURE_MS",
        "86400000",
        "Records timestamped further ahead of the clock are dead-lettered.",
    ),
    ("MILLSTREAM_ON_USER_ERROR", "dead-letter", "dead-letter or fail-stop."),
    (
        "MILLSTREAM_SMALL_BATCH_ROWS",
        "2000",
        "A computation's part of a batch with at most this many input rows runs its shards "
        "in the driver instead of a Spark job (about 0.2 s less per stage); 0: always Spark.",
    ),
    (
        "MILLSTREAM_DRIVER_READ",
        "on",
        "on: the driver reads each batch's Kafka ranges and log-file slices itself (Spark's "
        "offset log says which), with the sources' own readers (Kafka's with warm consumers); "
        "off: Spark tasks read them and the rows are collected as Arrow.",
    ),
    (
        "MILLSTREAM_OVERLAP_DELIVERY",
        "off",
        "on (experimental: under broker restarts its end-to-end test fails more often, being "
        "investigated): a batch's deliveries and acknowledgements finish while Spark starts the "
        "next batch, which waits for them before it runs; off: a batch ends when they did.",
    ),
    (
        "MILLSTREAM_QUERY_RESTARTS",
        "3",
        "Restarts of a failed query (from its checkpoint) within 10 minutes.",
    ),
    (
        "MILLSTREAM_EMBEDDED",
        "auto",
        "For unset REDIS_URL/KAFKA_BOOTSTRAP_SERVERS, throw-away embedded services: auto: only "
        "demo, bench and infra start them (run fails); always: run too (as run --embedded); "
        "never: none.",
    ),
    ("MILLSTREAM_STATE_DIR", ".millstream", "Working folder for embedded services and outputs."),
    (
        "MILLSTREAM_METRICS_PORT",
        "(off)",
        "Port on which `millstream run` serves Prometheus metrics at /metrics, 1-65535.",
    ),
    ("MILLSTREAM_METRICS_HOST", "127.0.0.1", "Address the metrics server binds to."),
    (
        "MILLSTREAM_LOG_LEVEL",
        "INFO",
        "DEBUG, INFO, WARNING or ERROR. py4j's and Spark's own logs show only at DEBUG.",
    ),
    (
        "MILLSTREAM_REPORT_SECONDS",
        "10",
        "`millstream run` logs a progress line per computation this often when something "
        "changed (0: never); dead letters are reported within a second either way.",
    ),
    (
        "MILLSTREAM_JVM_ARCHIVE",
        "auto",
        "auto: Spark's driver JVM maps the class archive `make setup` builds "
        "(`python -m millstream.jvm_archive`), starting about 4 s sooner; off: it does not.",
    ),
    (
        "MILLSTREAM_KAFKA_*",
        "(none)",
        "Passed to Kafka clients: MILLSTREAM_KAFKA_SASL_USERNAME -> sasl.username.",
    ),
    (
        "MILLSTREAM_TEST_*",
        "(none)",
        "Test-suite only: MILLSTREAM_TEST_REDIS_IMAGE, MILLSTREAM_TEST_KAFKA_IMAGE, "
        "MILLSTREAM_TEST_CRASH_AT (millstream.testing._crash).",
    ),
)
_KNOWN = {name for name, _, _ in VARIABLES if not name.endswith("*")}
_PREFIXES = ("MILLSTREAM_KAFKA_", "MILLSTREAM_TEST_")
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "KEY_PASSWORD", "JAAS")


_SECRET_QUERY = re.compile(r"((?:^|&)[^=&]*(?:password|secret|token)[^=&]*=)[^&]*", re.I)


def mask_url(url: str | None) -> str | None:
    """Hide the password of a URL such as rediss://user:pw@host:6380/0?ssl_ca_certs=/ca.pem.

    Query parameters stay, except secret ones (`?password=`, `?ssl_password=`): masked too.
    """
    if url and "?" in url:
        base, _, query = url.partition("?")
        url = base + "?" + _SECRET_QUERY.sub(r"\1***", query)
    if not url or "@" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _is_secret(name: str) -> bool:
    return any(word in name.upper() for word in _SECRET_WORDS)


def _parse(
    env: Mapping[str, str], name: str, default: str, conv: Callable[[str], T], hint: str
) -> T:
    raw = env.get(name, default).strip()
    try:
        return conv(raw)
    except (ValueError, TypeError):
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected {hint}.") from None


def _bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    def conv(raw: str) -> int:
        value = int(raw)
        if not lo <= value <= hi:
            raise ValueError(raw)
        return value

    return conv


def _choice(*allowed: str) -> Callable[[str], str]:
    def conv(raw: str) -> str:
        if raw.lower() not in allowed:
            raise ValueError(raw)
        return raw.lower()

    return conv


_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")


def _host(raw: str) -> str:
    """An IP address or a host name; binding to it is tried when the server starts."""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        if not _HOSTNAME.match(raw):
            raise
        return raw


_JVM_SIZE = re.compile(r"^([0-9]+)([kmgt])$")
_MIB_PER = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _jvm_memory(raw: str) -> str:
    """A JVM size Spark takes (digits and k/m/g/t), at least 512 MiB: below about 450 MiB
    Spark's memory manager refuses to start, with an error that does not name the setting."""
    found = _JVM_SIZE.match(raw.lower())
    if found is None or int(found.group(1)) * _MIB_PER[found.group(2)] < 512:
        raise ValueError(raw)
    return raw.lower()


def _java_options(raw: str) -> tuple[str, ...]:
    """JVM options for Spark's driver. The heap is refused here: Spark refuses -Xmx in
    spark.driver.extraJavaOptions with an error that does not name the setting."""
    options = tuple(raw.split())
    for option in options:
        if not option.startswith("-") or option.startswith(("-Xmx", "-Xms")):
            raise ValueError(raw)
    return options


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0.0 < value < 0.5:
        raise ValueError(raw)
    return value


def validate_redis_url(url: str) -> str:
    """Reject a malformed REDIS_URL with a message that says what a good one looks like."""
    parts = urlsplit(url)
    hint = "a URL like redis://localhost:6379/0, rediss://host:6380 or unix:///path/redis.sock"
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"REDIS_URL={mask_url(url)!r} is invalid: expected {hint}.")
    if parts.scheme != "unix":
        try:
            port = parts.port
        except ValueError:
            raise ConfigurationError(
                f"REDIS_URL={mask_url(url)!r} has a bad port: expected {hint}."
            ) from None
        if not parts.hostname or (port is not None and not 0 < port < 65536):
            raise ConfigurationError(f"REDIS_URL={mask_url(url)!r} is invalid: expected {hint}.")
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ConfigurationError(
                f"REDIS_URL={mask_url(url)!r}: database {db!r} is not a number."
            )
    return url


_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def validate_bootstrap(servers: str) -> str:
    for item in servers.split(","):
        match = _HOSTPORT.match(item.strip().removeprefix("PLAINTEXT://").removeprefix("SSL://"))
        if not match or not 0 < int(match.group(2)) < 65536:
            raise ConfigurationError(
                f"KAFKA_BOOTSTRAP_SERVERS={servers!r} is invalid at {item!r}: "
                "expected host:port[,host:port], e.g. localhost:9092."
            )
    return servers


@dataclass(frozen=True)
class Settings:
    """Every knob millstream reads from the environment; build with `Settings.from_env()`."""

    kafka_bootstrap_servers: str | None = None
    redis_url: str | None = None
    app: str = DEFAULT_APP
    spark_master: str = "local[2]"
    spark_driver_memory: str = "1g"
    driver_java_options: tuple[str, ...] = tuple(DRIVER_JAVA_OPTIONS.split())
    checkpoint_dir: str = ".millstream/checkpoints"
    shards: int = 8
    trigger_ms: int = 200
    max_records_per_batch: int = 200_000
    max_pending_productions: int = 100_000
    bucket_seconds: int = 600
    gc_slack_seconds: int = 3600
    bloom_expected: int = 200_000
    bloom_fp_rate: float = 0.001
    idle_slack_ms: int = 2000
    outage_grace_ms: int = 15_000
    user_retries: int = 3
    max_record_bytes: int = 1 << 20
    max_future_ms: int = 86_400_000
    on_user_error: str = "dead-letter"
    query_restarts: int = 3
    small_batch_rows: int = 2000
    driver_read: bool = True
    overlap_delivery: bool = False
    embedded: str = "auto"
    state_dir: str = ".millstream"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"
    report_seconds: int = 10
    jvm_archive: str = "auto"
    kafka_extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate; raises ConfigurationError naming the variable and the fix."""
        env = os.environ if environ is None else environ
        unknown = sorted(
            k
            for k in env
            if k.startswith("MILLSTREAM_") and k not in _KNOWN and not k.startswith(_PREFIXES)
        )
        if "MILLSTREAM_RUNTIME" in unknown:
            raise ConfigurationError(
                "MILLSTREAM_RUNTIME is gone: every application runs as fused queries (the "
                "per-computation queries were removed); unset it."
            )
        if unknown:
            raise ConfigurationError(
                f"unknown variable {unknown[0]}: see the README's configuration table for valid names."
            )
        redis_url = env.get("REDIS_URL") or None
        bootstrap = env.get("KAFKA_BOOTSTRAP_SERVERS") or None
        app = env.get("MILLSTREAM_APP", DEFAULT_APP)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", app):
            raise ConfigurationError(
                f"MILLSTREAM_APP={app!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'."
            )
        extra = {
            k.removeprefix("MILLSTREAM_KAFKA_").lower().replace("_", "."): v
            for k, v in env.items()
            if k.startswith("MILLSTREAM_KAFKA_")
        }
        return cls(
            kafka_bootstrap_servers=validate_bootstrap(bootstrap) if bootstrap else None,
            redis_url=validate_redis_url(redis_url) if redis_url else None,
            app=app,
            spark_master=env.get("MILLSTREAM_SPARK_MASTER", "local[2]"),
            spark_driver_memory=_parse(
                env,
                "MILLSTREAM_SPARK_DRIVER_MEMORY",
                "1g",
                _jvm_memory,
                "a size of 512m or more, as Spark writes it (768m, 1g, 2g)",
            ),
            driver_java_options=_parse(
                env,
                "MILLSTREAM_DRIVER_JAVA_OPTIONS",
                DRIVER_JAVA_OPTIONS,
                _java_options,
                "JVM options separated by spaces, each starting with '-' (the heap is "
                "MILLSTREAM_SPARK_DRIVER_MEMORY's, not -Xmx/-Xms)",
            ),
            checkpoint_dir=env.get("MILLSTREAM_CHECKPOINT_DIR", ".millstream/checkpoints"),
            shards=_parse(
                env, "MILLSTREAM_SHARDS", "8", _bounded_int(1, 4096), "an integer 1-4096"
            ),
            trigger_ms=_parse(
                env, "MILLSTREAM_TRIGGER_MS", "200", _bounded_int(0, 3_600_000), "milliseconds"
            ),
            max_records_per_batch=_parse(
                env,
                "MILLSTREAM_MAX_RECORDS_PER_BATCH",
                "200000",
                _bounded_int(1, 10**9),
                "a positive integer",
            ),
            max_pending_productions=_parse(
                env,
                "MILLSTREAM_MAX_PENDING_PRODUCTIONS",
                "100000",
                _bounded_int(1, 10**9),
                "a positive integer (productions per shard)",
            ),
            bucket_seconds=_parse(
                env, "MILLSTREAM_BUCKET_SECONDS", "600", _bounded_int(1, 86_400), "seconds, 1-86400"
            ),
            gc_slack_seconds=_parse(
                env, "MILLSTREAM_GC_SLACK_SECONDS", "3600", _bounded_int(0, 30 * 86_400), "seconds"
            ),
            bloom_expected=_parse(
                env,
                "MILLSTREAM_BLOOM_EXPECTED",
                "200000",
                _bounded_int(1, 10**9),
                "a positive integer",
            ),
            bloom_fp_rate=_parse(
                env, "MILLSTREAM_BLOOM_FP_RATE", "0.001", _fraction, "a rate in (0, 0.5)"
            ),
            idle_slack_ms=_parse(
                env, "MILLSTREAM_IDLE_SLACK_MS", "2000", _bounded_int(0, 86_400_000), "milliseconds"
            ),
            outage_grace_ms=_parse(
                env,
                "MILLSTREAM_OUTAGE_GRACE_MS",
                "15000",
                _bounded_int(0, 86_400_000),
                "milliseconds",
            ),
            user_retries=_parse(
                env, "MILLSTREAM_USER_RETRIES", "3", _bounded_int(0, 100), "an integer 0-100"
            ),
            max_record_bytes=_parse(
                env,
                "MILLSTREAM_MAX_RECORD_BYTES",
                "1048576",
                _bounded_int(1024, 1 << 30),
                "bytes, 1024-1073741824",
            ),
            max_future_ms=_parse(
                env,
                "MILLSTREAM_MAX_FUTURE_MS",
                "86400000",
                _bounded_int(0, 10 * 365 * 86_400_000),
                "milliseconds, 0-315360000000",
            ),
            on_user_error=_parse(
                env,
                "MILLSTREAM_ON_USER_ERROR",
                "dead-letter",
                _choice("dead-letter", "fail-stop"),
                "dead-letter or fail-stop",
            ),
            query_restarts=_parse(
                env, "MILLSTREAM_QUERY_RESTARTS", "3", _bounded_int(0, 1000), "an integer 0-1000"
            ),
            small_batch_rows=_parse(
                env,
                "MILLSTREAM_SMALL_BATCH_ROWS",
                "2000",
                _bounded_int(0, 10_000_000),
                "an integer 0-10000000",
            ),
            driver_read=_parse(
                env, "MILLSTREAM_DRIVER_READ", "on", _choice("on", "off"), "on or off"
            )
            == "on",
            overlap_delivery=_parse(
                env, "MILLSTREAM_OVERLAP_DELIVERY", "off", _choice("on", "off"), "on or off"
            )
            == "on",
            embedded=_parse(
                env,
                "MILLSTREAM_EMBEDDED",
                "auto",
                _choice("auto", "always", "never"),
                "auto, always or never",
            ),
            state_dir=env.get("MILLSTREAM_STATE_DIR", ".millstream"),
            metrics_port=_parse(
                env,
                "MILLSTREAM_METRICS_PORT",
                "",
                lambda s: _bounded_int(1, 65535)(s) if s else None,
                "a TCP port 1-65535, or unset for no metrics server",
            ),
            metrics_host=_parse(
                env,
                "MILLSTREAM_METRICS_HOST",
                "127.0.0.1",
                _host,
                "an address to bind, e.g. 127.0.0.1, 0.0.0.0 or ::",
            ),
            log_level=_parse(
                env,
                "MILLSTREAM_LOG_LEVEL",
                "INFO",
                lambda s: _choice("debug", "info", "warning", "error")(s).upper(),
                "DEBUG, INFO, WARNING or ERROR",
            ),
            jvm_archive=_parse(
                env, "MILLSTREAM_JVM_ARCHIVE", "auto", _choice("auto", "off"), "auto or off"
            ),
            report_seconds=_parse(
                env,
                "MILLSTREAM_REPORT_SECONDS",
                "10",
                _bounded_int(0, 86_400),
                "seconds, 0-86400 (0: no progress lines)",
            ),
            kafka_extra=extra,
        )

    def unset_endpoints(self) -> list[str]:
        """The names of REDIS_URL / KAFKA_BOOTSTRAP_SERVERS that are not set."""
        return [
            name
            for name, value in (
                ("REDIS_URL", self.redis_url),
                ("KAFKA_BOOTSTRAP_SERVERS", self.kafka_bootstrap_servers),
            )
            if not value
        ]

    def require_endpoints(self, *, embedded: bool = False) -> None:
        """`millstream run`'s rule: embedded services only when asked for, since their state is
        thrown away on exit (in production, state written nowhere durable).

        Asked for means `embedded=True` (`millstream run --embedded`) or MILLSTREAM_EMBEDDED=always;
        MILLSTREAM_EMBEDDED=never refuses them later, in `embedded_services`.
        """
        unset = self.unset_endpoints()
        if not unset or embedded or self.embedded == "always":
            return
        raise ConfigurationError(
            f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set: point "
            f"{'it' if len(unset) == 1 else 'them'} at your "
            f"{' and '.join('Redis' if n == 'REDIS_URL' else 'Kafka' for n in unset)}, or "
            "pass --embedded (or set MILLSTREAM_EMBEDDED=always) to start throw-away embedded "
            "services whose state is lost when they stop."
        )

    def kafka_config(self) -> dict[str, str]:
        """librdkafka settings every client shares: bootstrap servers plus pass-through security."""
        if not self.kafka_bootstrap_servers:
            raise ConfigurationError(
                "KAFKA_BOOTSTRAP_SERVERS is not set and no embedded broker is running."
            )
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.kafka_extra}

    def describe(self) -> dict[str, Any]:
        """A printable view with every secret masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "redis_url":
                value = mask_url(value)
            elif f.name == "kafka_extra":
                value = {
                    k: ("***" if _is_secret(k.replace(".", "_")) else v) for k, v in value.items()
                }
            out[f.name] = value
        return out

    def summary(self) -> str:
        """One line for the start-up log: every setting, secrets masked, `name=value`."""
        return " ".join(f"{name}={value}" for name, value in self.describe().items())

    def __repr__(self) -> str:
        return f"Settings({self.describe()!r})"
