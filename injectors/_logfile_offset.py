"""The log-file injector's Spark offset: every file's position, and what resuming needs.

The offset, as JSON:

    {"v": 1,
     "files": {"<dev>:<ino>:<born>": byte_offset},          # next unread byte, a line start
     "meta":  {"<dev>:<ino>:<born>": {"name": "app.log.1",   # where it was last seen
                                      "created": ms,         # its creation estimate
                                      "seen": bytes,         # its size at the last scan
                                      "fp": [n, crc32]}},    # crc of its first n bytes
     "lost":  {"<dev>:<ino>:<born>": [byte_offset, name]},  # unread bytes that vanished
     "wm": [event_ms, system_ms],
     "tick": n}

A file's identity is (st_dev, st_ino): stable when rotation renames it. `born` is the plan time
at which the file was first seen; it separates a file from a later one that reuses its inode
after deletion, which filesystems do freely (detected by the head fingerprint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OFFSET_VERSION = 1
NOTHING_KNOWN = 0  # the initial watermark: below every real millisecond timestamp
# Rotation events a position counts: a truncated file read on from its copy (copytruncate), a
# file picked up under its rotated name (created and rotated while the pipeline was down), a
# file whose unread bytes no file holds any more (an error row each).
COPIED, UNSEEN, LOST = "copytruncated", "rotated_unseen", "lost"
EVENTS = (COPIED, UNSEEN, LOST)


# --- the offset ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tracked:
    """One file generation the injector follows, and how far it has been admitted."""

    dev: int
    ino: int
    born: int
    offset: int
    name: str
    created: int
    seen: int
    fp: tuple[int, int]
    # Where its bytes are now when that is another file: the copy logrotate's copytruncate made
    # before truncating it. The key, and so every id, stays the original's.
    at: tuple[int, int] | None = None

    @property
    def key(self) -> str:
        return f"{self.dev}:{self.ino}:{self.born}"

    @property
    def inode(self) -> tuple[int, int]:
        """The file its unread bytes are in."""
        return self.at or (self.dev, self.ino)


@dataclass(frozen=True, slots=True)
class Position:
    """The decoded Spark offset."""

    files: dict[str, Tracked]
    lost: dict[str, tuple[int, str]]
    wm: tuple[int, int]
    tick: int
    # What rotation did, counted since the checkpoint began (EVENTS): published as counters.
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def initial(cls) -> Position:
        return cls({}, {}, (NOTHING_KNOWN, NOTHING_KNOWN), 0)

    def to_offset(self) -> dict[str, Any]:
        return {
            "v": OFFSET_VERSION,
            "files": {k: t.offset for k, t in sorted(self.files.items())},
            "meta": {
                k: {"name": t.name, "created": t.created, "seen": t.seen, "fp": list(t.fp)}
                | ({"at": list(t.at)} if t.at else {})
                for k, t in sorted(self.files.items())
            },
            "lost": {k: [o, n] for k, (o, n) in sorted(self.lost.items())},
            **({"counts": dict(sorted(self.counts.items()))} if self.counts else {}),
            "wm": list(self.wm),
            "tick": self.tick,
        }

    @classmethod
    def from_offset(cls, offset: dict[str, Any]) -> Position:
        if offset.get("v") != OFFSET_VERSION:
            raise ValueError(
                f"log-file offset version {offset.get('v')!r} is not {OFFSET_VERSION}; this "
                "checkpoint was written by another millstream version: start a new checkpoint"
            )
        files = {}
        for key, pos in offset["files"].items():
            dev, ino, born = (int(x) for x in key.split(":"))
            meta = offset["meta"][key]
            files[key] = Tracked(
                dev,
                ino,
                born,
                int(pos),
                meta["name"],
                meta["created"],
                meta["seen"],
                (meta["fp"][0], meta["fp"][1]),
                (int(meta["at"][0]), int(meta["at"][1])) if "at" in meta else None,
            )
        lost = {k: (int(v[0]), str(v[1])) for k, v in offset.get("lost", {}).items()}
        event, system = offset["wm"]
        counts = {str(k): int(v) for k, v in offset.get("counts", {}).items()}
        return cls(files, lost, (int(event), int(system)), int(offset["tick"]), counts)

    def same_as(self, other: Position) -> bool:
        """Equal apart from the plan time: nothing for a new batch to do or to announce."""
        return (
            self.files == other.files
            and self.lost == other.lost
            and self.counts == other.counts
            and self.wm[0] == other.wm[0]
            and self.tick == other.tick
        )


def split_key(key: str) -> tuple[int, int, int]:
    dev, ino, born = (int(x) for x in key.split(":"))
    return dev, ino, born
