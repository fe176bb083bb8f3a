"""JSON-lines files, one per delivery, that a replay cannot double or leave half-written.

Layout: `{directory}/{stream}/{app}.{computation}/shard-{n:05d}/{first:020d}-{last:020d}.jsonl`,
where first and last are the seqs of the productions in the file. A file is written under a
temporary name, fsynced and atomically renamed, so readers never see a partial file (list
only `*.jsonl`). Before writing, the sink lists the shard's folder and skips productions whose
seq is at or below the last seq already in a file: re-delivering after a crash writes only what
is missing, and re-delivering the same productions writes nothing.

One line per production: `id` (hex), `seq`, `stream`, `key`, `timestamp`, `system_time`,
`value` (base64, or UTF-8 text with `value_encoding="utf-8"`; a value that is not valid UTF-8
then goes to `value_b64`), `headers` (`[[name, base64 or null], ...]`).

Two writers delivering the same shard at the same moment (a zombie racing its successor) are
not fenced here: millstream's shard lease keeps that window small, but use
`KafkaTransactionalSink` where it must be closed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from millstream.errors import ConfigurationError, TransientError
from millstream.records import Production
from millstream.sinks.base import SKIPPED_DELIVERED, Delivery, DeliveryReport, ShardRef, Sink

_FINAL = re.compile(r"^(\d{20})-(\d{20})\.jsonl$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FileSink(Sink):
    """Write each shard's productions to atomically created JSON-lines files under `directory`.

    `fsync=False` trades durability on power loss for speed (the rename stays atomic).
    Temporary files older than `stale_temp_s` (left by a crashed writer) are removed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        value_encoding: Literal["base64", "utf-8"] = "base64",
        fsync: bool = True,
        stale_temp_s: float = 3600.0,
    ) -> None:
        if value_encoding not in ("base64", "utf-8"):
            raise ConfigurationError(f"value_encoding={value_encoding!r}: use 'base64' or 'utf-8'")
        self._root = Path(directory)
        self._encoding = value_encoding
        self._fsync = fsync
        self._stale = stale_temp_s

    def setup(self) -> None:
        """The folder exists (or can be created) and is writable."""
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            probe = self._root / f".probe.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigurationError(
                f"file sink folder {str(self._root)!r} is not writable ({exc}): create it and "
                "give the Spark workers' user write permission"
            ) from None

    def shard_dir(self, shard: ShardRef, stream: str) -> Path:
        """The folder that holds one (stream, shard)'s files."""
        return (
            self._root
            / _SAFE.sub("_", stream)
            / _SAFE.sub("_", f"{shard.app}.{shard.computation}")
            / f"shard-{shard.shard:05d}"
        )

    def deliver(self, shard: ShardRef, productions: Sequence[Production]) -> DeliveryReport:
        if not productions:
            return DeliveryReport(shard)
        outcome: dict[int, Delivery] = {}
        by_stream: dict[str, list[tuple[int, Production]]] = {}
        for index, production in enumerate(productions):
            by_stream.setdefault(production.stream, []).append((index, production))
        try:
            for stream, items in by_stream.items():
                folder = self.shard_dir(shard, stream)
                folder.mkdir(parents=True, exist_ok=True)
                done = self._delivered_up_to(folder)
                items.sort(key=lambda item: item[1].seq)
                todo = [(i, p) for i, p in items if p.seq > done]
                for i, p in items:
                    if p.seq <= done:
                        outcome[i] = Delivery(p.id, p.seq, str(folder), skipped=SKIPPED_DELIVERED)
                if todo:
                    path = self._write(folder, [p for _, p in todo])
                    for line, (i, p) in enumerate(todo):
                        outcome[i] = Delivery(p.id, p.seq, str(path), offset=line)
        except OSError as exc:
            raise TransientError(
                f"shard {shard}: writing under {str(self._root)!r} failed ({exc}); the "
                "checkpoints stay and are written again"
            ) from None
        return DeliveryReport.build(shard, ((p, outcome[i]) for i, p in enumerate(productions)))

    def _delivered_up_to(self, folder: Path) -> int:
        """Highest seq already in a complete file of this folder (-1 when none)."""
        top = -1
        now = time.time()
        with os.scandir(folder) as entries:
            for entry in entries:
                match = _FINAL.match(entry.name)
                if match:
                    top = max(top, int(match.group(2)))
                elif entry.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if now - entry.stat().st_mtime > self._stale:
                            os.unlink(entry.path)
        return top

    def _write(self, folder: Path, items: list[Production]) -> Path:
        final = folder / f"{items[0].seq:020d}-{items[-1].seq:020d}.jsonl"
        temp = folder / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        data = "".join(json.dumps(self._line(p), separators=(",", ":")) + "\n" for p in items)
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                handle.write(data)
                handle.flush()
                if self._fsync:
                    os.fsync(handle.fileno())
            os.replace(temp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        if self._fsync:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return final

    def _line(self, p: Production) -> dict[str, Any]:
        line: dict[str, Any] = {
            "id": p.id.hex(),
            "seq": p.seq,
            "stream": p.stream,
            "key": p.key,
            "timestamp": p.timestamp,
            "system_time": p.system_time,
        }
        if self._encoding == "utf-8":
            try:
                line["value"] = p.value.decode("utf-8")
            except UnicodeDecodeError:
                line["value_b64"] = base64.b64encode(p.value).decode("ascii")
        else:
            line["value"] = base64.b64encode(p.value).decode("ascii")
        line["headers"] = [
            [name, None if value is None else base64.b64encode(value).decode("ascii")]
            for name, value in p.headers
        ]
        return line
