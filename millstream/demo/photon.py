"""`millstream demo --job photon`: Photon's join, two pipelines active-active, under faults.

Clicks and the queries that showed their ads are generated (`photon_traffic`): most queries
on time, some late (the clicks wait and retry), some never (the clicks go unjoined). Two
pipelines (`photon_worker`, two applications with their own checkpoints) join them against one
IdRegistry. At 30% of the traffic pipeline A is SIGKILLed and restarted; at 55% pipeline B is
paused (SIGSTOP) for up to 20 s, a zombie datacenter, then resumed. Both pipelines' outputs are
read as they arrive and checked for at-most-once every 0.5 s. When every click has had its
give-up time, `join verify` runs over the whole traffic, `join recover` releases and rejoins
any orphan, and verify runs again. Exit 0 only when every check passes.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from millstream.demo.photon_traffic import OutputWatcher, Player, plan_traffic
from millstream.demo.report import percentiles, write_json
from millstream.settings import Settings
from millstream.state.keys import app_key
from millstream.state.watermarks import now_ms
from millstream.testing.process import PipelineProcess

PARTITIONS = 4
SHARDS = 4


def _metric(client: Any, app: str, name: str) -> int:
    return int(client.hget(app_key(app, "metrics", "joiner"), name) or 0)


def _wait(what: str, condition: Any, timeout: float, pipelines: list[PipelineProcess]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for pipeline in pipelines:
            if not pipeline.alive():
                raise RuntimeError(
                    f"a pipeline exited while waiting for {what}; see {pipeline.log_path}"
                )
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _say(text: str) -> None:
    print(f"millstream demo (photon): {text}", file=sys.stderr, flush=True)


def run_photon(
    duration: float, rate: float, seed: int, output: Path, settings: Settings, redis_url: str,
    bootstrap: str,
) -> dict[str, Any]:  # fmt: skip
    from millstream import join_tools
    from millstream.connectors.topics import ensure_topics
    from millstream.demo.photon_worker import topology_from
    from millstream.state.client import connect

    run_id = f"photon-{uuid.uuid4().hex[:8]}"
    apps = [f"{run_id}-a", f"{run_id}-b"]
    folder = output / run_id
    folder.mkdir(parents=True, exist_ok=True)
    kafka = {**settings.kafka_extra, "bootstrap.servers": bootstrap}
    max_delay_s = max(2.0, min(20.0, duration / 4))
    give_up_ms = int((max_delay_s + 10) * 1000)
    topics = {"clicks": f"{run_id}-clicks", "queries": f"{run_id}-queries"}
    config: dict[str, Any] = {
        "clicks_topic": f"{run_id}-clicks",
        "queries_topic": f"{run_id}-queries",
        "registry": run_id,
        "give_up_ms": give_up_ms,
        "max_out_of_order_ms": 1000,
        "shards": SHARDS,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    joined_topics = {a: f"{a}.joined" for a in apps}
    wanted = [*topics.values(), *joined_topics.values()]
    ensure_topics(kafka, dict.fromkeys(wanted, PARTITIONS))
    plan = plan_traffic(duration, rate, seed, max_delay_s, late=0.10, never=0.05, duplicates=0.02)
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "MILLSTREAM_TRIGGER_MS": os.environ.get("MILLSTREAM_TRIGGER_MS", "300"),
        "MILLSTREAM_LOG_LEVEL": os.environ.get("MILLSTREAM_LOG_LEVEL", "WARNING"),
    }
    pipelines = [
        PipelineProcess(
            [
                sys.executable,
                "-m",
                "millstream.demo.photon_worker",
                str(folder / "config.json"),
                app,
            ],
            {
                **env,
                "MILLSTREAM_APP": app,
                "MILLSTREAM_CHECKPOINT_DIR": str((folder / f"checkpoints-{app}").resolve()),
            },
            folder / f"pipeline-{app}.log",
        )
        for app in apps
    ]
    client = connect(redis_url)
    watcher = OutputWatcher(kafka, joined_topics)
    faults: list[dict[str, Any]] = []
    player: Player | None = None
    _say(f"{run_id}: {len(plan.fates)} clicks over {duration:.0f}s into two pipelines ({apps[0]}, "
         f"{apps[1]}); starting them (Spark takes a few seconds)")  # fmt: skip
    try:
        for pipeline in pipelines:
            pipeline.start()
        _wait("both pipelines to run a batch",
              lambda: all(client.hget(app_key(a, "metrics", "joiner"), "batches") for a in apps),
              240, pipelines)  # fmt: skip
        start = now_ms() + 500
        player = Player(plan, start, kafka, topics)
        watcher.start()
        player.start()
        began = time.monotonic()
        kill_at: float | None = duration * 0.3
        pause_at: float | None = duration * 0.55
        pause_s = min(20.0, duration / 5)
        last = 0.0
        resume_at: float | None = None
        while player.is_alive():
            elapsed = time.monotonic() - began
            if kill_at is not None and elapsed >= kill_at:
                kill_at = None
                pipelines[0].kill9()
                faults.append({"type": f"SIGKILL {apps[0]}, restarted", "at_s": elapsed})
                _say(f"SIGKILL of {apps[0]} at +{elapsed:.0f}s; restarting it")
                pipelines[0].start()
            if pause_at is not None and elapsed >= pause_at:
                pause_at = None
                pipelines[1].pause()
                faults.append({"type": f"SIGSTOP {apps[1]} for {pause_s:.0f}s", "at_s": elapsed})
                _say(f"SIGSTOP of {apps[1]} at +{elapsed:.0f}s for {pause_s:.0f}s")
                resume_at = time.monotonic() + pause_s
            if resume_at is not None and time.monotonic() >= resume_at:
                pipelines[1].resume()
                resume_at = None
                _say(f"SIGCONT of {apps[1]}")
            if elapsed - last >= 5:
                last = elapsed
                _progress(elapsed, duration, player, watcher, client, apps)
            time.sleep(0.25)
        if resume_at is not None:
            pipelines[1].resume()
        if player.error is not None:
            raise RuntimeError(f"traffic failed: {player.error}")
        end = start + plan.duration_ms
        settle_s = give_up_ms / 1000 + 20
        _say(f"traffic done; waiting up to {settle_s + 60:.0f}s for every click to be joined or "
             "given up")  # fmt: skip
        expected = {c for c, f in plan.fates.items() if f != "never"}
        _wait("every joinable click in the output",
              lambda: expected <= set(watcher.seen.first_seen), settle_s + 60, pipelines)  # fmt: skip
        _wait("the give-up time of the last click",
              lambda: now_ms() > end + give_up_ms + 5_000, settle_s + 60, pipelines)  # fmt: skip
        topology = topology_from(config, apps[0])
        verdicts, clicks = join_tools.verify(topology, apps, kafka, redis_url, until_ms=end)
        recovered: dict[str, int] = {}
        if verdicts.orphaned:
            recovered = join_tools.recover(topology, verdicts, clicks, apps[0], redis_url)
            _say(f"recovering {len(verdicts.orphaned)} orphans through {apps[0]}")
            time.sleep(5)
        for _ in range(30):
            verdicts, clicks = join_tools.verify(topology, apps, kafka, redis_url, until_ms=end)
            if verdicts.exactly_once or verdicts.orphaned:
                break
            time.sleep(2)  # in flight or waiting: give them a moment
        time.sleep(1.0)
    finally:
        if player is not None:
            player.stop()
        for pipeline in pipelines:
            pipeline.resume()
            pipeline.stop()
        watcher.stop()
    return _summary(run_id, folder, plan, player, watcher, verdicts, recovered, faults, client,
                    apps, start)  # fmt: skip


def _progress(elapsed: float, duration: float, player: Player, watcher: OutputWatcher,
              client: Any, apps: list[str]) -> None:  # fmt: skip
    joined = {a: 0 for a in apps}
    for _, app in list(watcher.seen.first_seen.values()):
        joined[app] = joined.get(app, 0) + 1
    races = sum(_metric(client, a, "lost_races") for a in apps)
    samples = watcher.seen.samples
    twice = samples[-1]["violations"] if samples else 0
    _say(f"[{elapsed:4.0f}s/{duration:.0f}s] clicks sent {len(player.sent_clicks)} | joined "
         f"{', '.join(f'{a[-1]} {n}' for a, n in joined.items())} | lost races {races} | "
         f"output twice {twice}")  # fmt: skip


def _summary(run_id: str, folder: Path, plan: Any, player: Any, watcher: OutputWatcher,
             verdicts: Any, recovered: dict[str, int], faults: list[dict[str, Any]],
             client: Any, apps: list[str], start: int) -> dict[str, Any]:  # fmt: skip
    seen = watcher.seen
    never = {c for c, f in plan.fates.items() if f == "never"}
    on_time = [
        (seen.first_seen[c][0] - player.sent_clicks[c]) / 1000
        for c, f in plan.fates.items()
        if f == "on_time" and c in seen.first_seen and c in player.sent_clicks
    ]
    per_app = {a: sum(1 for _, app in seen.first_seen.values() if app == a) for a in apps}
    violations = max((s["violations"] for s in seen.samples), default=0)
    stats = {n: sum(_metric(client, a, n) for a in apps)
             for n in ("joined", "lost_races", "retries", "unjoined", "registered_before")}  # fmt: skip
    checks = [
        ("no click output twice in any of the 0.5 s samples", violations == 0 and bool(seen.samples)),
        ("exactly once after verify and recover", verdicts.exactly_once),
        ("every click whose query came was joined",
         {c for c, f in plan.fates.items() if f != "never"} <= set(seen.first_seen)),
        ("no click whose query never came was joined", not (never & set(seen.first_seen))),
        ("every joined output is its click with the query that showed its ad",
         all({k: body.get(k) for k in ("click", "query", "terms", "ad")} == plan.joined[c]
             for c, body in seen.bodies.items())),
        ("every click whose query never came went unjoined", verdicts.missing == []
         and len(verdicts.unjoined) == len(never)),
        ("both pipelines contributed", all(n > 0 for n in per_app.values())),
        ("the pipelines raced for clicks and the registry let one through", stats["lost_races"] > 0),
    ]  # fmt: skip
    summary: dict[str, Any] = {
        "job": "photon",
        "run": run_id,
        "passed": all(ok for _, ok in checks),
        "checks": [{"name": n, "passed": ok} for n, ok in checks],
        "clicks": len(plan.fates),
        "at_most_once_violations": violations,
        "samples": len(seen.samples),
        "exactly_once": verdicts.exactly_once,
        "joined": len(seen.first_seen),
        "unjoined": len(verdicts.unjoined),
        "lost_races": stats["lost_races"],
        "retries": stats["retries"],
        "registered_before_crash": stats["registered_before"],
        "per_pipeline": {a: {"joined": per_app[a]} for a in apps},
        "latency_on_time_s": percentiles(on_time),
        "verify": verdicts.as_dict(),
        "recovered": recovered,
        "faults": faults,
        "output": str(folder),
    }
    summary["plot"] = _plot(folder, seen, apps, start, faults)
    write_json(folder / "summary.json", summary)
    return summary


def _plot(folder: Path, seen: Any, apps: list[str], start: int,
          faults: list[dict[str, Any]]) -> str | None:  # fmt: skip
    """Joined output per pipeline per second, faults marked; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for app in apps:
        per_s: dict[int, int] = {}
        for at, who in seen.first_seen.values():
            if who == app:
                per_s[(at - start) // 1000] = per_s.get((at - start) // 1000, 0) + 1
        xs = sorted(per_s)
        ax.plot(xs, [per_s[x] for x in xs], label=f"pipeline {app}", linewidth=1.2)
    for fault in faults:
        ax.axvline(fault["at_s"], color="red", linestyle="--", linewidth=1)
        ax.text(fault["at_s"], ax.get_ylim()[1] * 0.95, fault["type"].split()[0], color="red",
                fontsize=8)  # fmt: skip
    ax.set_xlabel("seconds since traffic start (red: faults)")
    ax.set_ylabel("joined clicks output per second")
    ax.set_title("Photon on millstream: two pipelines, one registry")
    ax.legend()
    path = folder / "joined_per_pipeline.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def text_report(summary: dict[str, Any]) -> str:
    per = ", ".join(f"{a}: {v['joined']}" for a, v in summary["per_pipeline"].items())
    lines = [
        f"Photon demo {summary['run']}: {'PASSED' if summary['passed'] else 'FAILED'}",
        f"  clicks {summary['clicks']}, joined {summary['joined']} "
        f"({per}), "
        f"unjoined {summary['unjoined']}, lost races {summary['lost_races']}, retries "
        f"{summary['retries']}",
        f"  at-most-once violations in {summary['samples']} samples: "
        f"{summary['at_most_once_violations']}; exactly once: {summary['exactly_once']}",
        f"  click -> joined output (on-time queries): {summary['latency_on_time_s']}",
    ]
    for fault in summary["faults"]:
        lines.append(f"  fault at +{fault['at_s']:.0f}s: {fault['type']}")
    for check in summary["checks"]:
        lines.append(f"  [{'ok' if check['passed'] else 'FAILED'}] {check['name']}")
    if summary.get("plot"):
        lines.append(f"  plot: {summary['plot']}")
    return "\n".join(lines)
