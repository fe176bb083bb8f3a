"""The `millstream` command: run topologies, the demo, status, embedded infrastructure."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from millstream.errors import ConfigurationError, MillstreamError


def _load_topology(target: str) -> Any:
    from millstream.connectors.topology import Topology

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(
            f"expected module:attribute, got {target!r} (e.g. myapp.pipeline:topology)"
        )
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
    topology = value() if callable(value) and not isinstance(value, Topology) else value
    if not isinstance(topology, Topology):
        raise ConfigurationError(f"{target} is a {type(topology).__name__}, expected a Topology")
    return topology


def _cmd_version(_: argparse.Namespace) -> int:
    from millstream import __version__

    print(f"millstream {__version__}")
    return 0


def _cmd_infra(args: argparse.Namespace) -> int:
    from millstream import embedded
    from millstream.settings import Settings

    settings = Settings.from_env()
    folder = Path(settings.state_dir) / "embedded"
    if args.action == "up":
        print(json.dumps(embedded.infra_up(folder), indent=2))
    elif args.action == "down":
        stopped = embedded.infra_down(folder)
        print("stopped" if stopped else "nothing was running")
    else:
        print(json.dumps(embedded.infra_status(folder), indent=2))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from millstream.connectors.app import run
    from millstream.report import RunReport
    from millstream.settings import Settings

    settings = Settings.from_env()
    topology = _load_topology(args.target)
    topology.validate()
    report = RunReport(settings.report_seconds)
    try:
        run(topology, settings, embedded=args.embedded, on_tick=report.on_tick)
    finally:
        report.finish()
    return 0


def _redis_for_status() -> str:
    from millstream import embedded
    from millstream.settings import Settings

    settings = Settings.from_env()
    if settings.redis_url:
        return settings.redis_url
    state = embedded.infra_status(Path(settings.state_dir) / "embedded")
    if state.get("up") and state.get("redis_url"):
        return str(state["redis_url"])
    raise ConfigurationError(
        "REDIS_URL is not set and no embedded Redis runs (millstream infra up)"
    )


def _kafka_for_tools() -> dict[str, str]:
    """Kafka for the commands that read topics: KAFKA_BOOTSTRAP_SERVERS (with the
    MILLSTREAM_KAFKA_* pass-through settings), else the embedded broker `infra up` started."""
    from millstream import embedded
    from millstream.settings import Settings

    settings = Settings.from_env()
    if settings.kafka_bootstrap_servers:
        return settings.kafka_config()
    state = embedded.infra_status(Path(settings.state_dir) / "embedded")
    if state.get("up") and state.get("kafka_bootstrap"):
        return {**settings.kafka_extra, "bootstrap.servers": str(state["kafka_bootstrap"])}
    raise ConfigurationError(
        "KAFKA_BOOTSTRAP_SERVERS is not set and no embedded Kafka runs (millstream infra up)"
    )


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not 0.1 <= value <= 86_400:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected seconds between 0.1 and 86400, got {raw!r}")
    return value


def _cmd_status(args: argparse.Namespace) -> int:
    import redis

    from millstream.settings import Settings
    from millstream.state.client import connect
    from millstream.status import status

    app = args.app or Settings.from_env().app
    client = connect(_redis_for_status())
    if args.watch is None:
        print(_render_status(status(client, app), args.json))
        return 0
    # Refresh in place: clear the screen and draw again (plain frames when not a terminal).
    clear = "\033[H\033[2J" if sys.stdout.isatty() else "\n"
    # Ctrl-C ends the loop between two frames: a KeyboardInterrupt raised anywhere (inside the
    # Redis client's parser, in the middle of a write) could leave the process stuck at exit.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        while not stop.is_set():
            try:
                frame = _render_status(status(client, app), args.json)
            except redis.RedisError as exc:  # keep watching: Redis may come back
                frame = f"app {app}: Redis did not answer ({exc}); retrying"
            stamp = time.strftime("%H:%M:%S")
            sys.stdout.write(f"{clear}every {args.watch:g}s, {stamp} (Ctrl-C stops)\n{frame}\n")
            sys.stdout.flush()
            stop.wait(args.watch)
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def _render_status(snapshot: dict[str, Any], as_json: bool) -> str:
    """`millstream status` output for one snapshot of `millstream.status.status`."""
    if as_json:
        return json.dumps(snapshot, indent=2)
    app = snapshot["app"]
    rows = snapshot["computations"]
    if not rows:
        return f"app {app!r}: no computation has committed a batch yet"
    lines = [f"app {app}"]
    for name, row in rows.items():
        lag = row["lag_ms"]
        lines.append(
            f"  {name}: low watermark lag {lag if lag is not None else '-'} ms, "
            f"batch {row['last_batch_seconds']} s, records {row['records']}, "
            f"duplicates {row['duplicates_dropped']}, late {row['late_records']}, "
            f"dead letters {row['dead_letters']}, lookups avoided {row['catalog_lookups_avoided']}, "
            f"pending productions {row['pending_productions']}, timers {row['timers_pending']}, "
            f"shards {row['shards']}"
            + (
                f" (rescale to {row['rescale_requested']} requested)"
                if row.get("rescale_requested")
                else ""
            )
            + (
                f", HELD BY BACKPRESSURE since {row['backpressure_since']}"
                if row["backpressure_since"]
                else ""
            )
        )
    if snapshot.get("replays_queued"):
        lines.append(
            f"  replayed dead letters queued, not applied yet: {snapshot['replays_queued']}"
        )
    for stream, counts in snapshot.get("injectors", {}).items():
        if counts:
            told = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
            lines.append(f"  stream {stream} (log files): {told}")
    return "\n".join(lines)


def _cmd_state(args: argparse.Namespace) -> int:
    from millstream.state.client import connect
    from millstream.state_tools import key_state, render_state

    if args.unpickle and args.serde != "pickle":
        raise ConfigurationError("--unpickle applies to --serde pickle only")
    client = connect(_redis_for_status())
    found = key_state(client, args.app, args.computation, args.key, args.serde, args.unpickle)
    print(json.dumps(found, indent=2) if args.json else render_state(found))
    return 0


def _cmd_reset(args: argparse.Namespace) -> int:
    from millstream.settings import Settings
    from millstream.state.client import connect
    from millstream.state_tools import apply_reset, plan_reset, refuse_if_running

    settings = Settings.from_env()
    client = connect(_redis_for_status())
    refuse_if_running(client, args.app)
    plan = plan_reset(client, args.app, settings.checkpoint_dir, args.computation)
    print(plan.describe())
    if not args.yes:
        try:
            answer = input("remove all of this? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    refuse_if_running(client, args.app)  # it may have started while we asked
    apply_reset(client, plan)
    print("removed: the next `millstream run` starts afresh")
    return 0


def _cmd_rescale(args: argparse.Namespace) -> int:
    from millstream.rescale_tool import rescale
    from millstream.state.client import connect

    client = connect(_redis_for_status())
    return rescale(client, args.app, args.computation, args.shards, args.timeout, args.wait)


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    from millstream.dead_letters import choose, read_letters, render, replay_letters
    from millstream.state.client import connect
    from millstream.state.shard_count import shard_counts_key

    topic = args.topic or f"{args.app}.dead-letters"
    client = connect(_redis_for_status())  # checked first: a replay needs it
    letters = read_letters(
        _kafka_for_tools(),
        topic,
        lambda n: print(f"read {n} letters so far", file=sys.stderr, flush=True),
    )
    chosen = choose(letters, args.computation, args.reason)
    if not args.replay:
        if args.json:
            print(json.dumps([x.summary() for x in chosen], indent=2))
        else:
            print(render(chosen, args.limit))
        return 0
    if not chosen:
        print("no dead letters to replay")
        return 0
    known = {
        k.decode() if isinstance(k, bytes) else k for k in client.hkeys(shard_counts_key(args.app))
    }
    stamped = "at the time they are applied" if args.restamp else "with their own event times"
    print(
        f"replay {len(chosen)} dead letters of app {args.app!r} ({topic}), {stamped}",
        file=sys.stderr if args.json else sys.stdout,
    )
    if not args.yes:
        try:
            answer = input("replay them? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing replayed")
            return 1
    report = replay_letters(client, args.app, chosen, args.restamp, known)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(
            f"queued {report.queued}, already replayed before {report.already_replayed}, "
            f"waiting in the queue now {report.waiting_in_queue}"
        )
        for why, n in report.not_replayable.items():
            print(f"not replayable: {n}: {why}")
        print("the running application applies them to their computations (millstream status)")
    return 0


def _cmd_join(args: argparse.Namespace) -> int:
    from millstream import join_tools

    topology = _load_topology(args.target)
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    if not apps:
        raise ConfigurationError("--apps: name the applications that run the join, comma-separated")
    if args.action == "recover" and args.into is None:
        raise ConfigurationError("recover needs --into APP: the application that rejoins them")
    if args.action == "recover" and args.into not in apps:
        raise ConfigurationError(f"--into must be one of --apps {apps}, got {args.into!r}")
    if args.abandon is not None and (args.action != "recover" or args.abandon not in apps):
        raise ConfigurationError(
            f"--abandon goes with recover and names one of --apps {apps}, got {args.abandon!r}"
        )
    redis_url = _redis_for_status()
    kafka = _kafka_for_tools()
    if args.abandon is not None:
        join_tools.check_gone(redis_url, args.abandon)  # before the (long) verify
    verdicts, clicks = join_tools.verify(topology, apps, kafka, redis_url, args.join, args.until_ms)
    if args.action == "verify":
        print(
            json.dumps(verdicts.as_dict(), indent=2) if args.json else join_tools.render(verdicts)
        )
        return 0 if verdicts.exactly_once else 1
    print(join_tools.render(verdicts), file=sys.stderr if args.json else sys.stdout)
    stranded = verdicts.in_flight_by_app().get(args.abandon, 0) if args.abandon else 0
    if not verdicts.orphaned and not stranded:
        for app, n in verdicts.in_flight_by_app().items():
            if app != args.into and join_tools.running(redis_url, app) is None:
                print(
                    f"{n} clicks are in flight on {app}, which is not running: if it is gone "
                    f"for good, --abandon {app} gives them to {args.into}",
                    file=sys.stderr,
                )
        print(json.dumps({"orphans": 0, "abandoned": 0}) if args.json else "no orphan to recover")
        return 0
    if not args.yes:
        what = f"{len(verdicts.orphaned)} orphans" + (
            f" and {stranded} clicks in flight on {args.abandon}" if stranded else ""
        )
        try:
            answer = input(f"release {what} and join them in {args.into}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing recovered")
            return 1
    done = join_tools.recover(
        topology, verdicts, clicks, args.into, redis_url, args.join, abandon=args.abandon,
        kafka=kafka,
    )  # fmt: skip
    given = f" + {done['abandoned']} in flight on {args.abandon}" if args.abandon else ""
    print(json.dumps(done, indent=2) if args.json else
          f"released {done['released']} of {done['orphans']} orphans{given}; queued "
          f"{done['requeued']} for {args.into}'s joiner (verify again once it has run)")  # fmt: skip
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from millstream.demo.cli import main as demo_main

    return demo_main(args)


def _cmd_chaos(args: argparse.Namespace) -> int:
    from millstream.chaos.cli import main as chaos_main

    return chaos_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from millstream.bench.cli import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="millstream",
        description="Exactly-once, MillWheel-style stream processing on Spark, Kafka and Redis.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version").set_defaults(func=_cmd_version)
    infra = sub.add_parser("infra", help="embedded Redis and Kafka for local use")
    infra.add_argument("action", choices=["up", "down", "status"])
    infra.set_defaults(func=_cmd_infra)
    run = sub.add_parser("run", help="run a topology until Ctrl-C or SIGTERM")
    run.add_argument(
        "target", help="module:attribute naming a Topology (or a function returning one)"
    )
    run.add_argument(
        "--embedded",
        action="store_true",
        help="start throw-away embedded Redis/Kafka for whichever of REDIS_URL and "
        "KAFKA_BOOTSTRAP_SERVERS is unset (local development: their state is lost on exit; "
        "same as MILLSTREAM_EMBEDDED=always)",
    )
    run.set_defaults(func=_cmd_run)
    st = sub.add_parser("status", help="watermarks, lag and counters per computation")
    st.add_argument("--app", help="application name (default MILLSTREAM_APP)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_positive_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    st.set_defaults(func=_cmd_status)
    state = sub.add_parser("state", help="a key's state, timers and holds, read from Redis")
    state.add_argument("app", help="application name (MILLSTREAM_APP of the pipeline)")
    state.add_argument("computation")
    state.add_argument("key", help="the record key, as the computation's key extractor gives it")
    state.add_argument(
        "--serde",
        choices=["json", "bytes", "pickle"],
        default="json",
        help="the computation's state serde (default json); bytes and pickle print the raw "
        "bytes' repr",
    )
    state.add_argument(
        "--unpickle",
        action="store_true",
        help="with --serde pickle, load the value to print it: this runs code stored in Redis, "
        "so only for state your own code wrote",
    )
    state.add_argument("--json", action="store_true", help="machine-readable output")
    state.set_defaults(func=_cmd_state)
    reset = sub.add_parser(
        "reset",
        help="remove an application's state, timers, catalogs, checkpoints and positions",
    )
    reset.add_argument("app", help="application name (MILLSTREAM_APP of the pipeline)")
    reset.add_argument(
        "--computation", metavar="NAME", help="only this computation's (its state and timers)"
    )
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=_cmd_reset)
    scale = sub.add_parser(
        "rescale",
        help="move a computation's keys to another shard count, while it runs or not",
    )
    scale.add_argument("app", help="application name (MILLSTREAM_APP of the pipeline)")
    scale.add_argument("computation", help="the computation whose shards change")
    scale.add_argument("--shards", type=int, required=True, help="the new shard count, 1-4096")
    scale.add_argument(
        "--timeout", type=_positive_seconds, default=120.0, metavar="S",
        help="how long to wait for the running application to apply it (default 120)",
    )  # fmt: skip
    scale.add_argument(
        "--wait", action="store_true",
        help="wait even if the application is not running now (for a start about to happen)",
    )  # fmt: skip
    scale.set_defaults(func=_cmd_rescale)
    dead = sub.add_parser(
        "dead-letters",
        help="list an application's dead letters with their reasons; --replay them after a fix",
    )
    dead.add_argument("app", help="application name (MILLSTREAM_APP of the pipeline)")
    dead.add_argument("--computation", metavar="NAME", help="only this computation's letters")
    dead.add_argument("--reason", metavar="TEXT", help="only letters whose reason contains TEXT")
    dead.add_argument(
        "--limit", type=int, default=20, metavar="N", help="letters shown after the counts (20)"
    )
    dead.add_argument("--json", action="store_true", help="machine-readable output")
    dead.add_argument(
        "--replay",
        action="store_true",
        help="re-inject the chosen letters' records into the computations that dead-lettered "
        "them, exactly once (a letter replayed before is skipped)",
    )
    dead.add_argument(
        "--restamp",
        action="store_true",
        help="with --replay: give the records the time they are applied instead of their own "
        "event time (which is usually behind the watermark by now, so late)",
    )
    dead.add_argument("--yes", action="store_true", help="with --replay: do not ask")
    dead.add_argument("--topic", help="the dead-letters topic (default APP.dead-letters)")
    dead.set_defaults(func=_cmd_dead_letters)
    join = sub.add_parser(
        "join",
        help="verify a join's output over the pipelines sharing its registry; recover orphans",
    )
    join.add_argument("action", choices=["verify", "recover"])
    join.add_argument("target", help="module:attribute naming the Topology with the join")
    join.add_argument(
        "--apps", required=True, help="the applications (MILLSTREAM_APP) running it, a,b"
    )
    join.add_argument("--join", metavar="NAME", help="the join, if the topology has several")
    join.add_argument(
        "--until-ms",
        type=int,
        metavar="MS",
        help="clicks up to this event time (default: now less the give-up time and 30 s)",
    )
    join.add_argument("--into", metavar="APP", help="recover: the application that rejoins them")
    join.add_argument(
        "--abandon",
        metavar="APP",
        help="recover: APP is gone for good (never restarted); its clicks in flight are "
        "released and joined in --into too (refused while APP runs)",
    )
    join.add_argument("--yes", action="store_true", help="recover: do not ask")
    join.add_argument("--json", action="store_true", help="machine-readable output")
    join.set_defaults(func=_cmd_join)
    demo = sub.add_parser("demo", help="the Zeitgeist anomaly-detection demo, verified")
    from millstream.demo.options import add_arguments

    add_arguments(demo)
    demo.set_defaults(func=_cmd_demo)
    bench = sub.add_parser("bench", help="benchmarks: throughput, latency, watermarks, dedup")
    from millstream.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)
    chaos = sub.add_parser(
        "chaos", help="a counter under a seeded schedule of real faults, verified by record id"
    )
    from millstream.chaos.cli import add_arguments as add_chaos_arguments

    add_chaos_arguments(chaos)
    chaos.set_defaults(func=_cmd_chaos)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except MillstreamError as exc:
        print(f"millstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
