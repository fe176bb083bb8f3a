"""The README's configuration table and commands match the code."""

from __future__ import annotations

import re
from pathlib import Path

from millstream.settings import VARIABLES

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_every_variable_is_in_the_readme_table_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `([A-Z_*]+)` \| ([^|]+) \|", README, flags=re.M))
    for name, default, _ in VARIABLES:
        assert name in rows, f"{name} missing from the README table"
        assert rows[name].strip() == default, (
            f"{name}: README says {rows[name]!r}, code {default!r}"
        )
    assert set(rows) == {name for name, _, _ in VARIABLES}


def test_readme_gives_the_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    assert "make demo" in README and "make test" in README
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "make test" in ci
