"""docs/design.md and the code that cites it agree.

Read from files relative to this one (no module of the checkout is imported): every citation of
the design in the repository's Python files names `docs/design.md` and a section it has, and
every module path the design names in backticks exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
CITING = ("millstream", "connectors", "injectors", "state", "sinks", "tests")

HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
# Any name of a design document: docs/design.md, DESIGN.md, docs/DESIGN.md, /elsewhere/DESIGN.md.
MENTION = re.compile(r"(?<![\w./-])((?:[\w.-]*/)*design\.md)(?!\w)", re.IGNORECASE)
# The numbers after a citation: "section 8", "sections 4, 5, 6 and 8", "sections 4-6, 8"; a
# citation may wrap onto the next line of a docstring or comment.
NUMBERS = re.compile(
    r"[\s#]+(?:sections?|§)[\s#]*(\d+(?:[\s#]*(?:,|-|and)[\s#]*\d+)*)", re.IGNORECASE
)
MODULE_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.py)`")


def design_sections() -> set[int]:
    return {int(n) for n in HEADING.findall(DESIGN.read_text())}


def python_files() -> Iterator[Path]:
    me = Path(__file__).resolve()
    for folder in CITING:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() != me and ".venv" not in path.parts:
                yield path


def section_numbers(text: str) -> list[int]:
    """The numbers of a citation: "4, 5-6 and 8" gives [4, 5, 6, 8]."""
    out: list[int] = []
    for part in re.split(r"\s*(?:,|\band\b)\s*", re.sub(r"[\s#]+", " ", text).strip()):
        low, _, high = part.replace(" ", "").partition("-")
        first = int(low)
        out.extend(range(first, int(high or first) + 1))
    return out


def citations() -> Iterator[tuple[str, str, list[int]]]:
    """(file:line, the document named, the section numbers cited) for every mention."""
    for path in python_files():
        text = path.read_text()
        for mention in MENTION.finditer(text):
            line = text.count("\n", 0, mention.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            numbers = NUMBERS.match(text, mention.end())
            yield where, mention.group(1), section_numbers(numbers.group(1)) if numbers else []


def test_the_design_numbers_its_sections_from_one() -> None:
    numbers = [int(n) for n in HEADING.findall(DESIGN.read_text())]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_section_numbers_are_parsed_in_every_citation_form() -> None:
    assert section_numbers("8") == [8]
    assert section_numbers("4, 5, 6 and 8") == [4, 5, 6, 8]
    assert section_numbers("4-6, 8") == [4, 5, 6, 8]
    found = NUMBERS.match(" sections 2 and\n    # 3 ...")
    assert found is not None and section_numbers(found.group(1)) == [2, 3]


def test_every_citation_names_docs_design_md_and_one_of_its_sections() -> None:
    sections = design_sections()
    found = list(citations())
    assert len(found) >= 5, "the citations in the code were not found: is the pattern right?"
    wrong = [
        f"{where}: cites {name!r}; the design is docs/design.md"
        for where, name, _ in found
        if name != "docs/design.md"
    ]
    wrong += [
        f"{where}: cites docs/design.md section {n}, which it does not have ({sorted(sections)})"
        for where, _, numbers in found
        for n in numbers
        if n not in sections
    ]
    assert not wrong, "\n".join(wrong)


def test_every_module_path_the_design_names_exists() -> None:
    named = sorted(set(MODULE_PATH.findall(DESIGN.read_text())))
    assert named, "the design names no module path: is the pattern right?"
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"
