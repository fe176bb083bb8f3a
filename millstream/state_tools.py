"""`millstream state` and `millstream reset`: look at one key, or make an application start afresh.

Both read the Redis layout of `state/keys.py`: a computation's shard keys share the hash tag
`{app:computation:shard}`, the application's own keys the tag `{app}`. Keys are found with SCAN
and a pattern (never KEYS, which blocks Redis), on every primary of a Redis Cluster.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from millstream.errors import ConfigurationError
from millstream.state.keys import ShardKeys, app_key, shard_of
from millstream.state.shard_count import (
    ShardLayout,
    rescale_reports_key,
    rescale_requests_key,
    retired_layouts_key,
    shard_counts_key,
)
from millstream.state.timers import timer_member
from millstream.state.watermarks import now_ms

# A query that ran a batch this recently is taken to be running: an application runs a batch
# at least every injector tick (1 s by default) while it is up.
RUNNING_WITHIN_MS = 30_000
SERDES = ("json", "bytes", "pickle")
_MAIN = "main"  # the first query's name (connectors/segments.py)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN / ZSCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def scan(client: Any, pattern: str) -> Iterator[str]:
    """Every key matching `pattern`, with SCAN (on each primary of a cluster)."""
    for key in client.scan_iter(match=pattern, count=1000):
        yield _text(key)


def shard_count(client: Any, app: str, computation: str) -> int:
    return layout_of(client, app, computation).shards


def layout_of(client: Any, app: str, computation: str) -> ShardLayout:
    """The computation's recorded shard layout; ConfigurationError if it never ran."""
    raw = client.hget(shard_counts_key(app), computation)
    if raw is None:
        known = sorted(_text(k) for k in client.hkeys(shard_counts_key(app)))
        raise ConfigurationError(
            f"app {app!r} has no computation {computation!r} in Redis "
            f"(computations that have run: {known or 'none'}); check MILLSTREAM_APP and REDIS_URL"
        )
    return ShardLayout.decode(raw)


def decode_state(raw: bytes, serde: str, unpickle: bool = False) -> Any:
    """What may be shown of a state value. JSON is parsed; bytes are shown as their repr; a
    pickle is loaded only when asked for (`unpickle`), since loading one runs code from Redis."""
    if serde == "json":
        try:
            return json.loads(raw)
        except ValueError:
            return {"undecodable_json": repr(raw)}
    if serde == "pickle" and unpickle:
        return repr(pickle.loads(raw))  # the user asked: for state their own code wrote
    return repr(raw)


def key_state(
    client: Any, app: str, computation: str, key: str, serde: str = "json", unpickle: bool = False
) -> dict[str, Any]:
    """A key's state, timers and holds, as JSON-able data."""
    layout = layout_of(client, app, computation)
    shard = shard_of(key, layout.shards)
    keys = ShardKeys(app, computation, shard, layout.generation)
    raw = client.hget(keys.state, key)
    prefix = _glob_escape(timer_member(key, ""))
    timers: list[dict[str, Any]] = []
    for domain in ("event", "wall"):
        for member, score in client.zscan_iter(keys.timers(domain), match=prefix + "*"):
            tag = _text(member).split("\x1f", 1)[1]
            timers.append({"domain": domain, "tag": tag, "time": int(score), "hold": None})
    if timers:
        pipe = client.pipeline(transaction=False)
        for timer in timers:
            pipe.zscore(keys.timer_holds, timer_member(key, timer["tag"]))
        for timer, hold in zip(timers, pipe.execute(), strict=True):
            if timer["domain"] == "event" and hold is not None:
                timer["hold"] = int(hold)
    timers.sort(key=lambda t: (t["time"], t["domain"], t["tag"]))
    return {
        "app": app,
        "computation": computation,
        "key": key,
        "shard": shard,
        "shards": layout.shards,
        "layout_generation": layout.generation,
        "serde": serde,
        "state": None if raw is None else decode_state(raw, serde, unpickle),
        "timers": timers,
    }


def render_state(found: dict[str, Any]) -> str:
    lines = [
        f"app {found['app']}, computation {found['computation']}, key {found['key']!r} "
        f"(shard {found['shard']} of {found['shards']})"
    ]
    state = found["state"]
    if state is None:
        lines.append("state: none")
    elif isinstance(state, str):
        lines.append(f"state ({found['serde']}): {state}")
    else:
        lines.append(f"state ({found['serde']}): {json.dumps(state, indent=2, sort_keys=True)}")
    if not found["timers"]:
        lines.append("timers: none")
    for timer in found["timers"]:
        hold = f", holds the watermark at {timer['hold']}" if timer["hold"] is not None else ""
        lines.append(f"timer {timer['tag']!r}: {timer['domain']} time {timer['time']}{hold}")
    return "\n".join(lines)


# --- reset -----------------------------------------------------------------------------------
def last_batches(client: Any, app: str) -> dict[str, int]:
    """Query or computation -> when it last ended a batch (ms), from the hashes the runtime
    updates after every batch."""
    out: dict[str, int] = {}
    for pattern in (app_key(app, "fused*"), app_key(app, "metrics", "*")):
        for key in scan(client, pattern):
            raw = client.hget(key, "updated_at")
            if raw is not None:
                out[key.removeprefix(app_key(app, ""))] = int(raw)
    return out


def refuse_if_running(client: Any, app: str, now: int | None = None) -> None:
    now = now_ms() if now is None else now
    recent = {k: now - at for k, at in last_batches(client, app).items()}
    busy = sorted((age, name) for name, age in recent.items() if age < RUNNING_WITHIN_MS)
    if busy:
        age, name = busy[0]
        raise ConfigurationError(
            f"app {app!r} is running: {name} ended a batch {age / 1000:.1f} s ago. Stop every "
            f"`millstream run` of it first (SIGTERM or Ctrl-C); a stopped application may be "
            f"reset {RUNNING_WITHIN_MS // 1000} s after its last batch"
        )


@dataclass
class ResetPlan:
    """What `reset` removes: whole keys, fields of the application's shared hashes, folders."""

    app: str
    computation: str | None
    keys: list[str] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)  # hash -> fields
    folders: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        what = f"computation {self.computation!r} of app" if self.computation else "app"
        lines = [f"reset {what} {self.app!r}: {len(self.keys)} Redis keys"]
        lines += [f"  fields {', '.join(f)} of {h}" for h, f in self.fields.items()]
        lines += [f"  folder {folder}" for folder in self.folders]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def plan_reset(
    client: Any, app: str, checkpoint_dir: str, computation: str | None = None
) -> ResetPlan:
    """The keys, hash fields and checkpoint folders that hold `app`'s progress (or only that of
    `computation`, which must have run)."""
    plan = ResetPlan(app, computation)
    root = f"{checkpoint_dir.rstrip('/')}/{app}"
    if computation is None:
        plan.keys = sorted({*scan(client, app_key(app, "*")), *scan(client, f"ms:{{{app}:*")})
        plan.folders = [root]
        return plan
    shard_count(client, app, computation)  # it must have run
    plan.keys = sorted(
        {
            *scan(client, f"ms:{{{app}:{computation}:*"),
            app_key(app, "metrics", computation),
            *scan(client, app_key(app, "consumed", computation, "*")),
            *scan(client, app_key(app, "catchup", computation, "*")),
        }
    )
    plan.fields = {
        key: [computation]
        for key in (
            app_key(app, "wm"), shard_counts_key(app), rescale_requests_key(app),
            rescale_reports_key(app), retired_layouts_key(app),
        )
    }  # fmt: skip
    for name, raw in client.hgetall(app_key(app, "segments")).items():
        members = json.loads(raw)["computations"]
        if computation not in members:
            continue
        segment = _text(name)
        if members == [computation]:  # a query of its own: its positions go too
            suffix = "" if segment == _MAIN else f"-{segment}"
            plan.fields[app_key(app, "segments")] = [segment]
            plan.keys.append(app_key(app, f"fused{suffix}"))
            plan.folders = [f"{root}/fused{suffix}"]
        else:
            plan.notes.append(
                f"{computation!r} shares query {segment!r} with {sorted(set(members) - {computation})}: "
                f"the query's input positions stay, so it goes on from there with empty state"
            )
    return plan


def apply_reset(client: Any, plan: ResetPlan) -> None:
    """Delete what `plan` names. Keys one by one in pipelines, so a cluster's keys of many
    slots are fine; the checkpoint folders last."""
    for start in range(0, len(plan.keys), 500):
        pipe = client.pipeline(transaction=False)
        for key in plan.keys[start : start + 500]:
            pipe.delete(key)
        pipe.execute()
    for hash_key, names in plan.fields.items():
        client.hdel(hash_key, *names)
    for folder in plan.folders:
        if "://" in folder and not folder.startswith("file://"):
            raise ConfigurationError(
                f"checkpoint folder {folder} is not on a local file system: delete it with its "
                f"own tools (Redis state is already reset)"
            )
        shutil.rmtree(Path(folder.removeprefix("file://")), ignore_errors=True)
