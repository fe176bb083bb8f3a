"""Import rules between the layers, read from the source with `ast` (no module is imported).

- Product code never imports test code: no module of `connectors/`, `injectors/`, `sinks/`,
  `state/` or the top-level `millstream/*.py` imports `millstream.testing` or `tests`. Faults
  reach the product through `millstream.fault_points`, installed from outside.
- A layer uses another layer's public modules only, never its `_private` ones.
- The runtime (`connectors/`) is built on the injectors, sinks and state, never the other way
  round: they do not import `millstream.connectors`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"connectors": "millstream.connectors", "injectors": "millstream.injectors"}
LAYERS |= {"sinks": "millstream.sinks", "state": "millstream.state"}
TEST_CODE = ("millstream.testing", "tests")


def product_modules() -> Iterator[tuple[str, Path]]:
    """(dotted package, file) of every product source file."""
    for folder, package in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield package, path
    for path in sorted((ROOT / "millstream").glob("*.py")):  # not demo/, bench/, chaos/, testing/
        yield "millstream", path


def imported_names(package: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in the file, function-level ones included.

    `from a import b` yields `a.b` as well as `a`, since `b` may be a module.
    """
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_walk_sees_imports_of_every_form(tmp_path: Path) -> None:
    """The checks below can only fail if the walk finds imports: prove that it does."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import millstream.testing._crash\n"
        "from millstream import testing\n"
        "def f():\n"
        "    from millstream.sinks._kafka import HEADER_ID\n"
        "from ._private import x\n"
    )
    names = {name for _, name in imported_names("millstream.connectors", sample)}
    assert "millstream.testing._crash" in names
    assert "millstream.testing" in names  # from millstream import testing
    assert "millstream.sinks._kafka" in names  # inside a function
    assert "millstream.connectors._private" in names  # relative
    assert sum(1 for _ in product_modules()) > 40


def test_product_code_never_imports_test_code() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package, path in product_modules()
        for line, name in imported_names(package, path)
        if any(_within(name, test) for test in TEST_CODE)
    ]
    assert offenders == [], "\n".join(offenders)


def test_layers_use_only_each_others_public_modules() -> None:
    offenders = []
    for package, path in product_modules():
        for line, name in imported_names(package, path):
            for other in LAYERS.values():
                if other == package or not _within(name, other):
                    continue
                rest = name[len(other) + 1 :].split(".")
                if rest[0].startswith("_"):
                    offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert offenders == [], "\n".join(offenders)


def test_only_the_runtime_imports_the_runtime() -> None:
    runtime = LAYERS["connectors"]
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package, path in product_modules()
        if package in (LAYERS["injectors"], LAYERS["sinks"], LAYERS["state"])
        for line, name in imported_names(package, path)
        if _within(name, runtime)
    ]
    assert offenders == [], "\n".join(offenders)


def _client_parameters(path: Path) -> Iterator[tuple[int, str]]:
    """(line, annotation) of every parameter or attribute named `client` or `_client`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.arg) and node.arg in ("client", "_client"):
            yield node.lineno, ast.unparse(node.annotation) if node.annotation else ""
        elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target).endswith("client"):
            yield node.lineno, ast.unparse(node.annotation)


def test_the_state_layer_types_its_redis_client() -> None:
    """A Redis client in `state/` is a `RedisClient` (state/client.py), never `object` or
    untyped, so its commands are checked instead of silenced with `type: ignore`."""
    offenders = []
    for path in sorted((ROOT / "state").rglob("*.py")):
        for line, annotation in _client_parameters(path):
            if annotation.removesuffix(" | None") != "RedisClient":
                offenders.append(f"{path.relative_to(ROOT)}:{line} client: {annotation!r}")
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in text:
                offenders.append(f"{path.relative_to(ROOT)}:{number} {text.strip()}")
    assert offenders == [], "\n".join(offenders)
