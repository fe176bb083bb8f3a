"""Which process runs an application: a heartbeat the running copy keeps in Redis.

A second copy of a running application (a rolling update that overlaps, an operator's mistake)
would stay exactly-once without this (shard leases fence it), but it would learn of the first
only from Spark failing its queries on the shared checkpoint. With it, `millstream run` finds
the holder at start (host, process, since when, last heartbeat), says so, and waits as a
standby; it takes over when the holder stops (it releases the key), dies (its heartbeat lapses
after `ttl_ms`, or at once when it ran on this host and its process is gone) or is paused past
its heartbeat. A holder that finds another copy holding its key stops: the shard leases fence
its writes anyway, and its supervisor's restart makes it the standby.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from millstream.state.client import RedisClient
from millstream.state.keys import app_key
from millstream.state.watermarks import now_ms

HOLDER = "holder"
TTL_MS = 10_000  # a holder whose heartbeat is this old is gone
BEAT_S = 2.0  # how often the holder renews it

# Claim or renew: a holder with another token is returned as it is; otherwise the key is ours
# (its `since` kept while it stays ours) and expires TTL after this beat.
_CLAIM = """
local token = redis.call('HGET', KEYS[1], 'token')
if token and token ~= ARGV[1] then
  return redis.call('HGETALL', KEYS[1])
end
if not token then
  redis.call('HSET', KEYS[1], 'since', ARGV[5])
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'host', ARGV[2], 'pid', ARGV[3],
           'started', ARGV[4], 'beat', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return false
"""
# Take over from a holder known to be dead: only if it is still that holder.
_REPLACE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
_RELEASE = _REPLACE


def holder_key(app: str) -> str:
    return app_key(app, HOLDER)


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), "" where unknown or dead:
    tells a live process from a new one that reuses its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return "" if fields[0] in ("Z", "X") else fields[19]  # a dead process not yet reaped


@dataclass(frozen=True)
class Holder:
    """A copy of the application: where it runs, since when, and its last heartbeat."""

    token: str
    host: str
    pid: int
    started: str  # the process's start time (`_process_start`)
    since: int = 0
    beat: int = 0

    @classmethod
    def this_process(cls) -> Holder:
        pid = os.getpid()
        return cls(uuid.uuid4().hex, socket.gethostname(), pid, _process_start(pid))

    def describe(self, now: int | None = None) -> str:
        ago = ((now or now_ms()) - self.beat) / 1000
        return (
            f"host {self.host} process {self.pid}, holding it since "
            f"{_clock(self.since)} (last heartbeat {ago:.1f} s ago)"
        )

    def gone_here(self) -> bool:
        """It ran on this host and its process is gone (or the pid now names another)."""
        if self.host != socket.gethostname():
            return False
        return _process_start(self.pid) != self.started or not self.started


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _clock(ms: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _holder(raw: list[Any]) -> Holder:
    """From HGETALL's reply as EVAL gives it: a flat list of names and values."""
    fields = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}
    return Holder(
        token=fields.get("token", ""),
        host=fields.get("host", "?"),
        pid=int(fields.get("pid", "0") or 0),
        started=fields.get("started", ""),
        since=int(fields.get("since", "0") or 0),
        beat=int(fields.get("beat", "0") or 0),
    )


def claim(client: RedisClient, app: str, me: Holder, ttl_ms: int = TTL_MS) -> Holder | None:
    """Hold the application (or renew it); the other holder if another copy holds it."""
    reply = client.eval(
        _CLAIM, 1, holder_key(app), me.token, me.host, str(me.pid), me.started, str(now_ms()),
        str(ttl_ms),
    )  # fmt: skip
    return _holder(list(cast(list[Any], reply))) if reply else None


def replace_dead(client: RedisClient, app: str, dead: Holder) -> bool:
    """Remove a holder known to be dead (`gone_here`) if it still holds the application."""
    return bool(client.eval(_REPLACE, 1, holder_key(app), dead.token))


def release(client: RedisClient, app: str, me: Holder) -> None:
    """Stop holding it (a clean stop): a standby takes over at its next look."""
    client.eval(_RELEASE, 1, holder_key(app), me.token)


def current(client: RedisClient, app: str) -> Holder | None:
    raw = client.hgetall(holder_key(app))
    if not raw:
        return None
    return _holder([x for kv in cast(dict[Any, Any], raw).items() for x in kv])
