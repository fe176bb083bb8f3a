"""The README's configuration table and commands match the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from millstream.cli import build_parser
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


def _commands() -> dict[str, argparse.ArgumentParser]:
    """`millstream --help`'s commands and their parsers."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_command_table_lists_every_command_of_millstream_help() -> None:
    section = README.split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `millstream (\w[\w-]*)([^`]*)` \|", section, flags=re.M)
    listed = [name for name, _ in rows]
    assert sorted(listed) == sorted(_commands()), "the README's command table and --help differ"
    assert len(listed) == len(set(listed))
    for name, usage in rows:
        known = set(_commands()[name]._option_string_actions)
        for option in re.findall(r"--[a-z][a-z-]*", usage):
            assert option in known, f"README: millstream {name} has no option {option}"
