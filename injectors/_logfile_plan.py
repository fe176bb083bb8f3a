"""Planning for the log-file injector: from one Spark offset and a directory listing to the next.

Runs on the driver (Spark's long-lived planner process). Everything the executors need to read a
batch, and everything needed to resume, lives in the offset itself (`_logfile_offset.py`); this
module holds no state between calls.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import BinaryIO

from millstream.injectors._logfile_directory import (
    Entry,
    copy_of,
    is_copy,
    open_verified,
    rotated_name,
    scan_directory,
)
from millstream.injectors._logfile_lines import (
    FINGERPRINT_BYTES,
    advance_bytes,
    advance_lines,
    fingerprint_matches,
    head_fingerprint,
    last_line_end,
)
from millstream.injectors._logfile_offset import (
    COPIED,
    LOST,
    NOTHING_KNOWN,
    UNSEEN,
    Position,
    Tracked,
)

log = logging.getLogger(__name__)


# --- the rules -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rules:
    """The watermark and finished-file rules, from the source options."""

    finished_after_ms: int
    slack_ms: int
    tick_ms: int
    tail_clock: bool


@dataclass(frozen=True, slots=True)
class Budget:
    """How much one batch may admit: rows, bytes or files (None: everything available)."""

    rows: int | None = None
    bytes: int | None = None
    files: int | None = None


def is_finished(
    mtime_ms: int, created: int, now: int, finished_after_ms: int, others_created: list[int]
) -> bool:
    """A file is finished when it has not grown for `finished_after_ms` and a newer file exists.

    Both conditions: a quiet log with no successor may just be idle and grow again, and a
    rotated-away file may still receive the writer's last lines until the writer reopens.
    """
    return now - mtime_ms >= finished_after_ms and any(c > created for c in others_created)


def event_watermark(
    views: list[tuple[int, bool, bool, int | None]], clock_wm: int, tail_clock: bool, now: int
) -> int:
    """MillWheel Figure 10: the minimum creation time over unfinished files.

    `views` holds (created, unread, finished, last) per file, `last` being the event time of a
    fully read file's last line (None: unknown). A file with unread bytes holds the watermark
    at its creation time. A fully read, finished file holds nothing. A fully read file that may
    still grow holds it at its creation time too, unless `tail_clock`: then at the newer of the
    clock minus slack and its last line's time (never past `now`), as a caught-up Kafka
    partition does (`injectors.watermark`): lines written later may be older than the last one
    only by the stream's out-of-order bound, which the runtime subtracts afterwards. With no
    file holding it, the watermark follows the clock minus slack; creation times never pass it.
    """
    out: int | None = None
    for created, unread, finished, last in views:
        if finished and not unread:
            continue  # read to its end and rotated away: holds nothing
        if not unread and tail_clock:
            hold = clock_wm if last is None else max(clock_wm, min(last, now))
        else:
            hold = min(created, clock_wm)
        out = hold if out is None else min(out, hold)
    return clock_wm if out is None else out


# --- planning ------------------------------------------------------------------------------------
FirstTimestamp = Callable[[BinaryIO], int | None]
LastTimestamp = Callable[[BinaryIO, int], int | None]  # (file, end of its last line)


@dataclass(slots=True)
class Planner:
    """Computes the next offset. Holds only configuration; positions come in and go out."""

    directory: str
    pattern: str
    rules: Rules
    first_timestamp: FirstTimestamp
    last_timestamp: LastTimestamp | None = None

    def plan(
        self,
        prev: Position,
        now: int,
        budget: Budget,
        caps: dict[tuple[int, int], int] | None = None,
    ) -> Position:
        """The offset after `prev`: admitted bytes, watermark and tick at plan time `now`.

        `caps` (Trigger.AvailableNow) freezes the set of files and their sizes at the moment
        the trigger started (it may gain tracked files the snapshot's listing missed). Returns
        `prev` itself when nothing changed, so Spark runs no batch.
        """
        now = max(now, prev.wm[1])
        tick = now // self.rules.tick_ms
        entries = self._scan(prev)
        if caps is not None:
            # Untracked files absent from the snapshot are left for a later run; a tracked one
            # the snapshot missed (a rename raced its listing) is capped where first seen.
            tracked = {t.inode for t in prev.files.values()}
            entries = {
                i: replace(e, size=min(e.size, caps.setdefault(i, e.size)))
                for i, e in entries.items()
                if i in caps or i in tracked
            }
        handles: dict[str, BinaryIO] = {}
        try:
            counts = dict(prev.counts)
            files, lost = self._reconcile(prev, entries, handles, counts)
            # A new generation's `born` exceeds every earlier plan time, so no key is ever reused.
            born = max(now, prev.wm[1] + 1)
            since = None if prev.wm[1] == NOTHING_KNOWN else prev.wm[1]
            if self._discover(files, entries, handles, born, since, counts):
                now = born
            files = self._admit(files, entries, handles, budget)
            unread = self._unread(files, entries, handles)
            lasts = self._last_times(files, handles, unread)
        finally:
            for fh in handles.values():
                fh.close()
        wm_event = self._watermark(files, entries, now, tick, unread, lasts)
        nxt = Position(files, lost, (max(prev.wm[0], wm_event), prev.wm[1]), tick, counts)
        if nxt.same_as(prev):
            return prev
        return replace(nxt, wm=(nxt.wm[0], now))

    def _scan(self, prev: Position) -> dict[tuple[int, int], Entry]:
        """List the directory; list it again if a tracked file seems gone.

        A rename between listing a name and stat-ing it hides a file from one listing. Taking a
        hidden file for deleted would forget it and later re-read it as new, so absence is
        confirmed by a second listing before a tracked file is dropped.
        """
        entries = scan_directory(self.directory, self.pattern)
        if any(t.inode not in entries for t in prev.files.values()):
            for inode, entry in scan_directory(self.directory, self.pattern).items():
                entries.setdefault(inode, entry)
        return entries

    def _reconcile(
        self,
        prev: Position,
        entries: dict[tuple[int, int], Entry],
        handles: dict[str, BinaryIO],
        counts: dict[str, int],
    ) -> tuple[dict[str, Tracked], dict[str, tuple[int, str]]]:
        """Follow each tracked file to its current name; drop vanished or replaced ones."""
        files: dict[str, Tracked] = {}
        lost: dict[str, tuple[int, str]] = {}
        for key, t in prev.files.items():
            entry = entries.get(t.inode)
            fh = open_verified(self.directory, entry.name, t.inode) if entry else None
            if entry is not None and fh is None:
                files[key] = t  # renamed under our feet: look again next trigger
                continue
            if fh is not None and entry is not None and _same_file(fh, t, entry.size):
                handles[key] = fh
                fp = t.fp
                if fp[0] < FINGERPRINT_BYTES and entry.size > fp[0]:
                    fp = head_fingerprint(fh, entry.size)
                files[key] = replace(t, name=entry.name, seen=entry.size, fp=fp)
                continue
            if fh is not None:
                fh.close()
            gone = "vanished" if entry is None else "was truncated or replaced"
            # Only a file still there but shorter or rewritten may have been copied first.
            claimed = {f.inode for f in prev.files.values()} | {f.inode for f in files.values()}
            copy = copy_of(self.directory, t.fp, entries, claimed) if entry is not None else None
            if copy is not None:
                # copytruncate: its bytes live on in the copy, at the same offsets, under its
                # ids. Nothing is lost; what was read is not read again.
                found, copy_fh = copy
                handles[key] = copy_fh
                offset = min(t.offset, found.size)  # a copy older than our reading has no more
                files[key] = replace(
                    t, offset=offset, name=found.name, seen=found.size, at=(found.dev, found.ino)
                )
                counts[COPIED] = counts.get(COPIED, 0) + 1
                log.info(
                    "log file %s (%s) %s; its copy %s holds its bytes: %d unread bytes from "
                    "offset %d are read from the copy, under the same ids (copytruncate)",
                    t.name,
                    key,
                    gone,
                    found.name,
                    max(0, found.size - offset),
                    offset,
                )
                continue
            if t.seen > t.offset:
                lost[key] = (t.offset, t.name)
                counts[LOST] = counts.get(LOST, 0) + 1
                log.warning(
                    "log file %s (%s) %s with bytes from offset %d unread; they are reported "
                    "as an error row",
                    t.name,
                    key,
                    gone,
                    t.offset,
                )
            else:
                log.info("log file %s (%s) %s after being read to the end", t.name, key, gone)
        return files, lost

    def _discover(
        self,
        files: dict[str, Tracked],
        entries: dict[tuple[int, int], Entry],
        handles: dict[str, BinaryIO],
        born: int,
        since: int | None,
        counts: dict[str, int],
    ) -> bool:
        """Start following files that match the pattern and are not followed yet, and files
        named as rotated ones (`app.log.1`) written since the last plan (`since`): a file
        created and rotated while the pipeline was down, never seen under its first name."""
        followed = {t.inode for t in files.values()}
        found = False
        for inode, entry in entries.items():
            if inode in followed:
                continue
            if not entry.matched and not (
                since is not None
                and entry.mtime_ms >= since
                and rotated_name(entry.name, self.pattern)
            ):
                continue
            fh = open_verified(self.directory, entry.name, inode)
            if fh is None:
                if os.path.exists(os.path.join(self.directory, entry.name)):
                    log.warning("log file %s matches but cannot be opened; not read", entry.name)
                continue
            followed_heads = [(f.inode, f.fp) for f in files.values()]
            if is_copy(self.directory, entry, fh, followed_heads, entries):
                log.debug("log file %s is a copy of a followed file: not picked up", entry.name)
                fh.close()
                continue
            created = entry.mtime_ms
            first = self.first_timestamp(fh)
            if first is not None:
                created = min(created, first)
            t = Tracked(
                inode[0],
                inode[1],
                born,
                0,
                entry.name,
                created,
                entry.size,
                head_fingerprint(fh, entry.size),
            )
            files[t.key] = t
            handles[t.key] = fh
            found = True
            if not entry.matched:
                counts[UNSEEN] = counts.get(UNSEEN, 0) + 1
                log.info(
                    "log file %s was created and rotated unseen: read under that name", entry.name
                )
        return found

    def _admit(
        self,
        files: dict[str, Tracked],
        entries: dict[tuple[int, int], Entry],
        handles: dict[str, BinaryIO],
        budget: Budget,
    ) -> dict[str, Tracked]:
        """Advance offsets over complete lines, oldest files first, within the budget."""
        rows, nbytes, nfiles = budget.rows, budget.bytes, budget.files
        admitted_any = False
        out = dict(files)
        for t in sorted(files.values(), key=lambda t: (t.created, t.born, t.key)):
            fh = handles.get(t.key)
            entry = entries.get(t.inode)
            if fh is None or entry is None or entry.size <= t.offset:
                continue
            if rows is not None:
                if rows <= 0:
                    break
                end, count = advance_lines(fh, t.offset, entry.size, rows)
                rows -= count
            elif nbytes is not None:
                if nbytes <= 0:
                    break
                end = advance_bytes(fh, t.offset, entry.size, nbytes, at_least_one=not admitted_any)
                nbytes -= end - t.offset
            else:
                if nfiles is not None and nfiles <= 0:
                    break
                end = last_line_end(fh, t.offset, entry.size)
            if end > t.offset:
                admitted_any = True
                if nfiles is not None:
                    nfiles -= 1
                out[t.key] = replace(t, offset=end)
        return out

    def _unread(
        self,
        files: dict[str, Tracked],
        entries: dict[tuple[int, int], Entry],
        handles: dict[str, BinaryIO],
    ) -> set[str]:
        """Files with complete lines not admitted yet (a budget stopped short of them). Bytes
        after a file's last newline are a line the writer is still writing: they hold nothing,
        as a caught-up file does, since its timestamp is decided only when it is complete. A
        file not open now (renamed under the listing) counts as unread when it has grown."""
        out = set()
        for key, t in files.items():
            entry = entries.get(t.inode)
            size = entry.size if entry is not None else t.seen
            if size <= t.offset:
                continue
            fh = handles.get(key)
            if fh is None or entry is None or last_line_end(fh, t.offset, entry.size) > t.offset:
                out.add(key)
        return out

    def _last_times(
        self, files: dict[str, Tracked], handles: dict[str, BinaryIO], unread: set[str]
    ) -> dict[str, int | None]:
        """Event time of each fully read file's last admitted line (the clock rule's data)."""
        if not self.rules.tail_clock or self.last_timestamp is None:
            return {}
        out: dict[str, int | None] = {}
        for key, t in files.items():
            fh = handles.get(key)
            if key not in unread and fh is not None and t.offset > 0:
                out[key] = self.last_timestamp(fh, t.offset)
        return out

    def _watermark(
        self,
        files: dict[str, Tracked],
        entries: dict[tuple[int, int], Entry],
        now: int,
        tick: int,
        unread: set[str],
        lasts: dict[str, int | None],
    ) -> int:
        created = [t.created for t in files.values()]
        views = []
        for key, t in files.items():
            entry = entries.get(t.inode)
            mtime = entry.mtime_ms if entry is not None else now
            finished = is_finished(mtime, t.created, now, self.rules.finished_after_ms, created)
            views.append((t.created, key in unread, finished, lasts.get(key)))
        clock_wm = tick * self.rules.tick_ms - self.rules.slack_ms
        return event_watermark(views, clock_wm, self.rules.tail_clock, now)


def _same_file(fh: BinaryIO, t: Tracked, size: int) -> bool:
    """Still the generation we follow: not shorter than what we read, and the same head."""
    return size >= t.offset and size >= t.fp[0] and fingerprint_matches(fh, t.fp)
