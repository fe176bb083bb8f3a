"""The log-file injector's options: parsed and checked on the driver, so a mistake fails before
any task runs, with the option's name and the fix. The module docstring of
`injectors/logfile.py` documents each one."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from millstream.errors import ConfigurationError
from millstream.injectors._logfile_parse import (
    TIMESTAMP_UNITS,
    JsonLinesParser,
    Parser,
    load_parser,
    text_parser,
)

SHORT_NAME = "millstream-logfile"
FORMATS = ("jsonl", "text")
MISSING_TIMESTAMP = ("error", "system")
TAIL_WATERMARK = ("creation", "clock")

# Documented name -> meaning (README's injector section lists them all); an unknown option is
# refused with this list, so a misspelt one never silently falls back to its default.
OPTIONS: dict[str, str] = {
    "path": "directory to watch (required, must exist)",
    "stream": "stream name of the injected records (required; the runtime sets it)",
    "pattern": "file-name glob of the files to pick up (default *.log)",
    "format": "jsonl (default) or text (value = the line, no key, timestamp = system time)",
    "parser": "module:function(line bytes) -> (key, timestamp ms, value); excludes format",
    "keyField": "jsonl field holding the Kafka-style record key (default key)",
    "idField": "jsonl field holding the record's own id (default: none, the line's position)",
    "timestampField": "jsonl field holding the event time (default ts)",
    "timestampUnit": "ms (default, integers only) or s (integers or fractions)",
    "missingTimestamp": "error (default: the line is dead-lettered) or system (system time)",
    "maxRecordsPerTrigger": "admission control: at most this many lines per micro-batch",
    "maxBytesPerTrigger": "admission control: at most this many bytes per micro-batch",
    "bytesPerPartition": "split large ranges into Spark tasks of this many bytes (64 MiB)",
    "finishedAfterMs": "a file not modified this long with a newer sibling is finished (60000)",
    "tailWatermark": "clock (default) or creation (MillWheel's Figure 10): see above",
    "watermarkSlackMs": "the clock-following watermark's lag behind the clock (idleSlackMs)",
    "tickMs": "run a (possibly empty) batch at least this often (default 1000)",
    "redis.url": "publish the injector watermark to this Redis (the runtime sets it)",
    "app": "application name: Redis key namespace of the watermark (the runtime sets it)",
    "instance": "injector instance name for watermark publication (default host:path)",
    "throttle": "true: plan no batch while the app's throttle pauses this stream (set by a join)",
    # Set by the runtime for every source; the Kafka injector's idle policy, unused here.
    "idleSlackMs": "the default of watermarkSlackMs (the runtime sets MILLSTREAM_IDLE_SLACK_MS)",
    "outageGraceMs": "ignored by log files (the Kafka injector's outage hold)",
}


@dataclass(frozen=True, slots=True)
class LogFileOptions:
    """Validated source options. Built on the driver, so mistakes fail before any task runs."""

    path: str
    stream: str
    pattern: str = "*.log"
    format: str = "jsonl"
    parser: str | None = None
    key_field: str = "key"
    id_field: str | None = None
    timestamp_field: str = "ts"
    timestamp_unit: str = "ms"
    missing_timestamp: str = "error"
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    bytes_per_partition: int = 64 << 20
    finished_after_ms: int = 60_000
    tail_watermark: str = "clock"
    watermark_slack_ms: int = 5_000
    tick_ms: int = 1_000
    redis_url: str | None = None
    app: str | None = None
    instance: str = ""
    throttle: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> LogFileOptions:
        """Parse Spark's (case-insensitive) string options; every error names option and fix."""
        opts = {k.lower(): v for k, v in options.items()}
        known = {name.lower() for name in OPTIONS}
        unknown = sorted(k for k in opts if k not in known)
        if unknown:
            raise ConfigurationError(
                f"unknown option {unknown[0]!r} for format {SHORT_NAME!r}: valid options are "
                + ", ".join(OPTIONS)
                + "."
            )
        path = _required(opts, "path", "the directory holding the log files")
        if not os.path.isdir(path):
            raise ConfigurationError(
                f"option 'path': {path!r} is not an existing directory; create it or point "
                "'path' at the directory the logs are written to"
            )
        path = os.path.abspath(path)
        fmt = _choice(opts, "format", FORMATS, "jsonl")
        parser = opts.get("parser") or None
        if parser is not None:
            if "format" in opts:
                raise ConfigurationError(
                    "options 'format' and 'parser' exclude each other: drop 'format' when a "
                    "custom parser reads the lines"
                )
            load_parser(parser)
        max_rows = _optional_int(opts, "maxRecordsPerTrigger", minimum=1)
        max_bytes = _optional_int(opts, "maxBytesPerTrigger", minimum=1)
        if max_rows is not None and max_bytes is not None:
            raise ConfigurationError(
                "options 'maxRecordsPerTrigger' and 'maxBytesPerTrigger' exclude each other: "
                "set one"
            )
        redis_url = opts.get("redis.url") or None
        app = opts.get("app") or None
        if redis_url is not None and app is None:
            raise ConfigurationError(
                "option 'app' is required with 'redis.url': the watermark is published under "
                "the application's namespace"
            )
        throttle = _choice(opts, "throttle", ("true", "false"), "false") == "true"
        if throttle and redis_url is None:
            raise ConfigurationError("option throttle=true needs redis.url (where the flag is)")
        pattern = opts.get("pattern", "*.log")
        if not pattern or "/" in pattern:
            raise ConfigurationError(
                f"option 'pattern' must be a file-name glob such as '*.log', got {pattern!r}"
            )
        return cls(
            path=path,
            stream=_required(opts, "stream", "the name of the stream the lines feed"),
            pattern=pattern,
            format=fmt,
            parser=parser,
            key_field=opts.get("keyfield", "key"),
            timestamp_field=opts.get("timestampfield", "ts"),
            id_field=opts.get("idfield") or None,
            timestamp_unit=_choice(opts, "timestampUnit", TIMESTAMP_UNITS, "ms"),
            missing_timestamp=_choice(opts, "missingTimestamp", MISSING_TIMESTAMP, "error"),
            max_records_per_trigger=max_rows,
            max_bytes_per_trigger=max_bytes,
            bytes_per_partition=_int(opts, "bytesPerPartition", 64 << 20, minimum=1),
            finished_after_ms=_int(opts, "finishedAfterMs", 60_000, minimum=0),
            tail_watermark=_choice(opts, "tailWatermark", TAIL_WATERMARK, "clock"),
            # The Kafka injector's idle slack when the runtime gives one: both injectors of a
            # stream then close windows alike once their input goes quiet.
            watermark_slack_ms=_int(
                opts, "watermarkSlackMs", _int(opts, "idleSlackMs", 5_000, minimum=0), minimum=0
            ),
            tick_ms=_int(opts, "tickMs", 1_000, minimum=1),
            redis_url=redis_url,
            app=app,
            instance=opts.get("instance") or f"{socket.gethostname()}:{path}",
            throttle=throttle,
        )

    def line_parser(self) -> tuple[Parser, str]:
        """The configured parser and the name error rows use for it."""
        if self.parser is not None:
            return load_parser(self.parser), self.parser
        if self.format == "text":
            return text_parser, "text"
        parser = JsonLinesParser(
            self.key_field, self.timestamp_field, self.timestamp_unit, self.id_field
        )
        return parser, "jsonl"


def _required(opts: dict[str, str], name: str, what: str) -> str:
    value = opts.get(name)
    if not value:
        raise ConfigurationError(f"option '{name}' is required: {what}")
    return value


def _choice(opts: dict[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = opts.get(name.lower(), default)
    if value not in choices:
        raise ConfigurationError(
            f"option '{name}' must be one of {', '.join(choices)}; got {value!r}"
        )
    return value


def _int(opts: dict[str, str], name: str, default: int, *, minimum: int) -> int:
    value = _optional_int(opts, name, minimum=minimum)
    return default if value is None else value


def _optional_int(opts: dict[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigurationError(f"option '{name}' must be an integer >= {minimum}, got {raw!r}")
    return value
