"""Line parsers of the log-file injector: good lines, and a reason for every bad one."""

from __future__ import annotations

import pytest

from millstream.errors import ConfigurationError
from millstream.injectors._logfile_parse import (
    BadLine,
    JsonLinesParser,
    Parsed,
    load_parser,
    parse_line,
    text_parser,
)

JSONL = JsonLinesParser()


def test_jsonl_takes_key_and_timestamp_and_keeps_the_line_as_value() -> None:
    line = b'{"key": "user-1", "ts": 1700000000123, "x": [1, 2.5]}'
    assert JSONL(line) == (b"user-1", 1_700_000_000_123, line)
    assert JSONL(b'{"key": 42, "ts": 5}') == (b"42", 5, b'{"key": 42, "ts": 5}')


def test_jsonl_custom_fields() -> None:
    parser = JsonLinesParser(key_field="user", timestamp_field="at")
    assert parser(b'{"user": "u", "at": 7}')[:2] == (b"u", 7)


def test_missing_or_null_timestamp_is_none_for_the_caller_to_decide() -> None:
    assert JSONL(b'{"key": "a"}')[1] is None
    assert JSONL(b'{"key": "a", "ts": null}')[1] is None


def test_seconds_unit_accepts_fractions_exactly() -> None:
    parser = JsonLinesParser(unit="s")
    assert parser(b'{"key": "a", "ts": 1700000000.123}')[1] == 1_700_000_000_123
    assert parser(b'{"key": "a", "ts": 1700000000}')[1] == 1_700_000_000_000
    assert parser(b'{"key": "a", "ts": 1.0009}')[1] == 1000  # floored, not rounded


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "invalid JSON"),
        (b'{"key": "a", "ts": 1', "invalid JSON"),
        (b"", "invalid JSON"),
        (b'["key", 1]', "expected a JSON object"),
        (b'{"ts": 1}', "missing key field 'key'"),
        (b'{"key": null, "ts": 1}', "must be a string or an integer"),
        (b'{"key": true, "ts": 1}', "must be a string or an integer"),
        (b'{"key": "a", "ts": "yesterday"}', "must be a number"),
        (b'{"key": "a", "ts": true}', "must be a number"),
        (b'{"key": "a", "ts": 1.5}', "integer number of milliseconds"),
        (b'{"key": "a", "ts": NaN}', "invalid JSON"),
        (b'{"key": "a", "ts": 99999999999999999999999}', "out of range"),
        (b'{"key": "a", "ts": 1}\xff', "invalid JSON"),
    ],
)
def test_jsonl_malformed_lines_raise_with_a_reason(line: bytes, reason: str) -> None:
    with pytest.raises(BadLine, match=reason):
        JSONL(line)


def test_text_parser_has_no_key_and_no_event_time() -> None:
    assert text_parser(b"GET / 200") == (None, None, b"GET / 200")


def good_parser(line: bytes) -> Parsed:
    key, _, ts = line.partition(b" ")
    return key, int(ts), line


def test_load_parser_imports_module_function() -> None:
    parser = load_parser(f"{__name__}:good_parser")
    assert parse_line(parser, b"k 12", "p") == (b"k", 12, b"k 12", None)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("no_colon", "expected 'module:function'"),
        ("no.such.module_xyz:f", "cannot import"),
        (f"{__name__}:missing", "has no"),
        (f"{__name__}:JSONL_NOT_THERE", "has no"),
        ("json:__doc__", "has no callable"),
    ],
)
def test_load_parser_errors_name_the_option(spec: str, reason: str) -> None:
    with pytest.raises(ConfigurationError, match="option parser=") as info:
        load_parser(spec)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (ValueError("boom"), "raised ValueError: boom"),
        ((b"k", 1), "must return"),
        (("k", 1, b"v"), "key of type str"),
        ((b"k", 1, "v"), "value of type str"),
        ((b"k", 1.5, b"v"), "timestamp of type float"),
        ((b"k", True, b"v"), "timestamp of type bool"),
        ((b"k", 2**63, b"v"), "out-of-range"),
    ],
)
def test_parse_line_turns_parser_bugs_into_bad_lines(result: object, reason: str) -> None:
    def parser(line: bytes) -> Parsed:
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[return-value]

    with pytest.raises(BadLine, match=reason):
        parse_line(parser, b"line", "mine:parse")


def test_id_field_gives_a_content_id_so_a_record_written_twice_is_one() -> None:
    parser = JsonLinesParser(key_field="q", timestamp_field="ts", id_field="id")
    line = b'{"q": "cats", "ts": 5, "id": "e-17"}'
    assert parse_line(parser, line, "jsonl") == (b"cats", 5, line, b"ie-17")
    with pytest.raises(BadLine, match="id field 'id'"):
        parse_line(parser, b'{"q": "cats", "ts": 5}', "jsonl")
