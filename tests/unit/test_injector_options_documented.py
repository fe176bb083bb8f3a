"""Every option either injector accepts is in the README's injector section, and an option
neither documents is refused: the README is the reference a user reads instead of the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from millstream.errors import ConfigurationError
from millstream.injectors._kafka_options import OPTIONS as KAFKA_OPTIONS
from millstream.injectors._kafka_options import KafkaInjectorOptions
from millstream.injectors.logfile import OPTIONS as LOGFILE_OPTIONS
from millstream.injectors.logfile import LogFileOptions

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"### {title}")
    end = text.index("\n## ", start) if "\n## " in text[start:] else len(text)
    nxt = text.find("\n### ", start + 4)
    return text[start : min(end, nxt if nxt != -1 else end)]


@pytest.mark.parametrize(
    ("options", "name"),
    [(KAFKA_OPTIONS, "millstream-kafka"), (LOGFILE_OPTIONS, "millstream-logfile")],
)
def test_every_option_has_a_row_in_the_readme(options: dict[str, str], name: str) -> None:
    section = _section("Injectors and their options")
    rows = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
    missing = sorted(set(options) - rows)
    assert not missing, f"{name} options missing from README's injector section: {missing}"
    assert f"**`{name}`**" in section


def test_an_unknown_logfile_option_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError, match=r"unknown option .finishedaftrms.*finishedAfterMs"
    ):
        LogFileOptions.from_options({"path": str(tmp_path), "stream": "s", "finishedAftrMs": "1"})
    # Every documented option is accepted (the runtime sets some of them for every source).
    parsed = LogFileOptions.from_options(
        {"path": str(tmp_path), "stream": "s", "idleSlackMs": "2000", "outageGraceMs": "1",
         "tailWatermark": "clock", "finishedAfterMs": "2000", "tickMs": "500"}
    )  # fmt: skip
    assert parsed.tail_watermark == "clock" and parsed.finished_after_ms == 2000


def test_an_unknown_kafka_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown option"):
        KafkaInjectorOptions.parse({"bootstrap.servers": "x:1", "topics": "t", "idHeaderr": "id"})
