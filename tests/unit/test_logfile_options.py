"""Option validation of the log-file injector: every mistake fails on the driver, named."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from millstream.errors import ConfigurationError
from millstream.injectors.logfile import LogFileInjector, LogFileOptions, LogFileStreamReader


def test_defaults(tmp_path: Path) -> None:
    opts = LogFileOptions.from_options({"path": str(tmp_path), "stream": "s"})
    assert (opts.pattern, opts.format, opts.key_field, opts.timestamp_field) == (
        "*.log",
        "jsonl",
        "key",
        "ts",
    )
    assert (opts.missing_timestamp, opts.tick_ms, opts.finished_after_ms) == ("error", 1000, 60_000)
    assert opts.instance.endswith(str(tmp_path))
    assert LogFileStreamReader(opts).getDefaultReadLimit() == ReadAllAvailable()


def test_options_are_case_insensitive_and_limits_map_to_spark(tmp_path: Path) -> None:
    base = {"PATH": str(tmp_path), "Stream": "s"}
    rows = LogFileOptions.from_options({**base, "maxRecordsPerTrigger": "10"})
    assert LogFileStreamReader(rows).getDefaultReadLimit() == ReadMaxRows(10)
    nbytes = LogFileOptions.from_options({**base, "maxbytespertrigger": "99"})
    assert LogFileStreamReader(nbytes).getDefaultReadLimit() == ReadMaxBytes(99)


def test_data_source_validates_in_its_constructor(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="option 'stream' is required"):
        LogFileInjector({"path": str(tmp_path)})
    assert LogFileInjector.name() == "millstream-logfile"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"path": "/no/such/dir"}, "option 'path'.*not an existing directory"),
        ({"stream": ""}, "option 'stream' is required"),
        ({"format": "csv"}, "option 'format' must be one of jsonl, text"),
        ({"missingTimestamp": "drop"}, "option 'missingTimestamp' must be one of error, system"),
        ({"timestampUnit": "us"}, "option 'timestampUnit'"),
        ({"tailWatermark": "x"}, "option 'tailWatermark'"),
        ({"maxRecordsPerTrigger": "0"}, "option 'maxRecordsPerTrigger' must be an integer >= 1"),
        ({"maxRecordsPerTrigger": "ten"}, "option 'maxRecordsPerTrigger'"),
        ({"maxRecordsPerTrigger": "1", "maxBytesPerTrigger": "1"}, "exclude each other"),
        ({"tickMs": "0"}, "option 'tickMs' must be an integer >= 1"),
        ({"finishedAfterMs": "-1"}, "option 'finishedAfterMs'"),
        ({"pattern": "logs/*.log"}, "option 'pattern' must be a file-name glob"),
        ({"redis.url": "redis://localhost"}, "option 'app' is required with 'redis.url'"),
        ({"throttle": "yes"}, "option 'throttle' must be one of true, false"),
        ({"throttle": "true"}, "option throttle=true needs redis.url"),
        ({"parser": "nope"}, "option parser='nope' is invalid: expected 'module:function'"),
        ({"parser": "json:loads", "format": "text"}, "'format' and 'parser' exclude each other"),
    ],
)
def test_invalid_options_name_the_option(tmp_path: Path, extra: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        LogFileOptions.from_options({"path": str(tmp_path), "stream": "s", **extra})
