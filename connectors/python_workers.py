"""The Python that Spark starts: importing pyspark compiled, not from `pyspark.zip`.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (and py4j's zip) first on the PYTHONPATH of
every Python process it starts: each query's streaming source runner, each worker daemon.
Python keeps no bytecode for a module it imports from a zip archive, so each of these
processes compiles most of pyspark's source again: 1.1 s of CPU per process on this 2-core
machine (the runner's imports: 1.9 s from the zip, 0.85 s compiled), paid at every query start
and restart. A pip-installed pyspark has the same files in its package folder, compiled at
install. The launcher here runs this interpreter with a folder first on its PYTHONPATH that
links to the installed pyspark and py4j only, so their imports find the compiled files before
the zips, and nothing else on the path changes order.

Used for PYSPARK_PYTHON when the user has not chosen one (it names this interpreter, as the
default did), and only for a pip-installed pyspark (a SPARK_HOME of its own keeps Spark's
path). Executors on other machines need a PYSPARK_PYTHON of the user's anyway.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

_PACKAGES = ("pyspark", "py4j")


def _package_dir(name: str) -> Path:
    module = __import__(name)
    return Path(module.__file__ or "").resolve().parent


def _replace_link(link: Path, target: Path) -> None:
    """`link` -> `target`, swapped in atomically (another process may be doing the same)."""
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    os.replace(temporary, link)


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text and os.access(path, os.X_OK):
        return
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    temporary.chmod(0o755)
    os.replace(temporary, path)


def launcher(folder: Path | None = None) -> str | None:
    """The path of an executable that runs this interpreter with the installed pyspark and
    py4j first on its path; None when pyspark is not a pip install (no `python/lib/pyspark.zip`
    in its package folder) or the launcher cannot be written."""
    try:
        packages = {name: _package_dir(name) for name in _PACKAGES}
    except ImportError:
        return None
    if not (packages["pyspark"] / "python" / "lib" / "pyspark.zip").is_file():
        return None
    if folder is not None:
        folder = folder.resolve()
    else:
        # One per interpreter and install: two virtualenvs on one machine never share one.
        tag = hashlib.sha256(
            "\0".join([sys.executable, *map(str, packages.values())]).encode()
        ).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"millstream-python-{os.getuid()}-{tag}"
    links = folder / "packages"
    script = folder / "python"
    try:
        links.mkdir(parents=True, exist_ok=True)
        for name, target in packages.items():
            _replace_link(links / name, target)
        _write_if_changed(
            script,
            "#!/bin/sh\n"
            "# Written by millstream (connectors/python_workers.py): Spark's Python processes\n"
            "# import the installed pyspark and py4j, compiled, before Spark's zips.\n"
            f'PYTHONPATH={shlex.quote(str(links))}"${{PYTHONPATH:+:$PYTHONPATH}}" '
            f'exec {shlex.quote(sys.executable)} "$@"\n',
        )
    except OSError:
        return None  # a read-only temporary folder: Spark's own path, slower but the same
    return str(script)


def default_worker_python(folder: Path | None = None) -> None:
    """PYSPARK_PYTHON, unless the user set it: this interpreter, through the launcher (in
    `folder`, else the temporary folder) where there is one. A pipeline keeps it in its state
    folder, where no cleaner of temporary files removes it while the pipeline runs (a query
    restarted then starts Python processes again)."""
    if "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = launcher(folder) or sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
