"""`machine.json`: what the figures were measured on, and the exact command line."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any


def _run(argv: list[str], *, stderr: bool = True) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + (done.stderr if stderr else "")).strip()


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _java() -> str | None:
    out = _run(["java", "-version"])
    match = re.search(r'version "([^"]+)"', out)
    return match.group(1) if match else None


def _tansu() -> str | None:
    from millstream.embedded import _tansu_bin

    try:
        return _run([_tansu_bin(), "--version"]).removeprefix("tansu ").strip() or None
    except Exception:
        return None


def _redis(redis_url: str) -> str | None:
    from millstream.state.client import connect

    try:
        return str(connect(redis_url).info("server")["redis_version"])
    except Exception:
        return None


def _quix() -> str | None:
    python = Path(".millstream/bench/quix-venv/bin/python")
    if not python.exists():
        return None
    probe = [str(python), "-c", "import quixstreams; print(quixstreams.__version__)"]
    return _run(probe, stderr=False) or None


def source_tree() -> dict[str, Any] | None:
    """The code the run measured: the git commit, and the files that differed from it (with a
    hash of that difference), since pipelines import the working tree. None outside git."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    head = _run(["git", "-C", str(root), "rev-parse", "HEAD"], stderr=False)
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return None

    def git(*args: str) -> bytes:
        try:
            return subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return b""

    status = git("status", "--porcelain", "--untracked-files=all").decode(errors="replace")
    dirty = sorted(
        path
        for line in status.splitlines()
        if (path := line[3:]).endswith(".py") and not path.startswith(("tests/", "benchmarks/"))
    )
    diff = git("diff", "HEAD", "--", *dirty) if dirty else b""
    return {
        "head": head,
        "uncommitted_py": dirty,
        "diff_sha256": hashlib.sha256(diff).hexdigest()[:16] if dirty else None,
    }


def describe(redis_url: str, bootstrap: str, argv: list[str]) -> dict[str, Any]:
    import pyspark

    return {
        "command": "millstream " + shlex.join(argv),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "cpu_model": _cpu_model(),
        "os": platform.platform(),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "java": _java(),
        "spark": pyspark.__version__,
        "redis": _redis(redis_url),
        "kafka_broker": "tansu " + (_tansu() or "?")
        if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        else f"external at {bootstrap}",
        "tansu": _tansu(),
        "quixstreams": _quix(),
    }
