"""`make typecheck`: mypy over the package laid out as it is installed.

pyproject.toml maps the top-level folders connectors/, injectors/, sinks/ and state/ to the
subpackages millstream.connectors, ... ([tool.setuptools] package-dir). The editable install
resolves them with an import hook, which mypy does not run (python/mypy#13392), and mypy itself
has no such mapping: given the folders, it names their modules connectors.*, injectors.*, ... and
every `millstream.<layer>` import is unresolved, so Any (ignore_missing_imports), and no error
across those modules is found.

So this builds build/mypy-tree/, links to the real files laid out as package-dir says
(build/mypy-tree/millstream/connectors -> connectors/, build/mypy-tree/millstream/cli.py ->
millstream/cli.py, ...), rebuilt on every run so new files are in it, runs mypy on it with its own
cache (build/mypy-cache, which a plain `mypy millstream` with the other module names cannot
confuse), and prints mypy's output with the paths mapped back to the repository's files.
Arguments go to mypy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = Path("build/mypy-tree")
CACHE = Path("build/mypy-cache")


def package_dirs() -> dict[str, str]:
    """Package name -> its folder, relative to the repository (pyproject's package-dir)."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        mapping: dict[str, str] = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    return {package: folder.rstrip("/") for package, folder in mapping.items()}


def build_tree(mapping: dict[str, str]) -> list[Path]:
    """Lay the mapped packages out under TREE; returns the top-level package folders in it."""
    if TREE.is_symlink() or TREE.exists():
        shutil.rmtree(TREE)  # removes the links, never what they point to
    roots: list[Path] = []
    for package in sorted(mapping, key=lambda name: name.count(".")):
        source = ROOT / mapping[package]
        dest = TREE.joinpath(*package.split("."))
        if "." not in package:
            roots.append(dest)
        children = {
            name.rpartition(".")[2] for name in mapping if name.rpartition(".")[0] == package
        }
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not children:  # the folder is the package as it is
            dest.symlink_to(os.path.relpath(source, dest.parent), target_is_directory=True)
            continue
        dest.mkdir()
        for entry in sorted(source.iterdir()):
            if entry.name in children:
                sys.exit(f"typecheck: {entry} clashes with package {package}.{entry.name}")
            if entry.name != "__pycache__":
                (dest / entry.name).symlink_to(os.path.relpath(entry, dest))
    return roots


def path_mapper(mapping: dict[str, str]) -> tuple[re.Pattern[str], dict[str, str]]:
    """A pattern of the tree's package folders, deepest first, and the folder each stands for."""
    folders = {
        f"{TREE.as_posix()}/{package.replace('.', '/')}/": f"{folder}/"
        for package, folder in mapping.items()
    }
    ordered = sorted(folders, key=len, reverse=True)
    return re.compile("|".join(re.escape(folder) for folder in ordered)), folders


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    mapping = package_dirs()
    roots = build_tree(mapping)
    pattern, folders = path_mapper(mapping)
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        "pyproject.toml",
        "--cache-dir",
        str(CACHE),
        *argv,
        *(str(root) for root in roots),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(pattern.sub(lambda m: folders[m.group(0)], line))
            sys.stdout.flush()
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
