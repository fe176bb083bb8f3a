"""`millstream bench`: run the benchmark scenarios, print their tables, write JSON and PNGs.

Each scenario runs on an embedded Redis and broker of its own, started for it and stopped after
it (or on REDIS_URL / KAFKA_BOOTSTRAP_SERVERS when set, shared by every scenario): the embedded
broker answers more slowly the more it holds (README, its defects), so a scenario run on the
one before it measured that one's leftovers: the shards' Kafka transactions of the latency
scenario after the throughput scenario took 0.27-0.38 s a batch (deliver_ack p50) against
0.055-0.067 s on a fresh broker (benchmarks/results/keyrecords-20261201 against
latency-keyrecords-20261201). Each writes `<scenario>.json` (plus PNGs) into `--output`;
the run writes `machine.json` (hardware, versions, the exact command line), `summary.json` and
`targets.json` (the issues' targets, judged on this run's figures only).
Pipelines run as subprocesses; their logs stay under `.millstream/bench/runs/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from millstream.bench._harness import DRIVER_READ_CHOICES, Bench, say, write_json
from millstream.bench.targets import compute as compute_targets

SCENARIOS = ("throughput", "latency", "watermarks", "dedup", "scaling", "steady", "join")
NOTES = """
How to read these figures (the module docstrings in `millstream/bench/` say exactly what is
measured):

- Compare ratios within one run, not absolute numbers across runs: the load average above is
  the machine's, other work included, and on a shared 2-core machine it moves every figure.
- Throughput counts from each system's first progress to all N events committed, start-up
  excluded (shown apart). millstream runs after a warm-up application in the same Spark
  session; the plain Spark baseline also counts a warm-up topic first. Quix Streams commits
  every 1 s in the throughput runs and every 0.2 s (millstream's trigger) in the latency runs.
  Each system runs 3 times and is reported by its median run, every repeat's rate beside it
  (`millstream-eo` and `millstream-no-eo`, exactly-once on and off, interleaved in one
  process).
- Every millstream application runs as one fused query (productions handed to consumers
  inside the micro-batch); there is no runtime to choose. Latency: the millstream pipelines,
  then the Spark floor, then Quix. Watermarks: the three-stage pipeline with
  `MILLSTREAM_IDLE_SLACK_MS=500`.
- Record latency: produce -> visible to a `read_committed` consumer (computed live from the
  raw log and its transaction markers). The exactly-once pass-through, the same with
  `exactly_once=False`, and the window counter run one after another, each alone in a
  pipeline process of its own (as the Spark floor's query is one pass-through).
- millstream closes a window when the low watermark passes its end; a caught-up Kafka partition
  is idle and its watermark is now - `MILLSTREAM_IDLE_SLACK_MS` (the default 2 s in the
  latency scenario, 0.5 s in the watermarks scenario), which bounds window latency from below.
  Quix closes a key's window when a later record reaches the partition.
- `targets.json`: the issues' targets (#16's medians, #24's lifted window count, #25's tails
  and memory, #28's join), judged on this run's figures only; beside #16's, the
  removed per-computation queries runtime's value as recorded in `benchmarks/results/fused-ab`
  (`baseline`; another run, so its seconds and megabytes carry that run's load). The peak RSS
  goal is the issue's "today's" (2,687 MB). A target whose scenario did not run says
  "not measured in this run".
- The embedded broker (Tansu) answers a waiting Fetch on a ~250 ms tick (INFRA.md): a floor
  under every latency measured here, for every system.
- Peak RSS is summed over the pipeline's process tree (driver, JVM, Python workers), sampled
  twice a second; `restarts` counts Spark queries restarted from their checkpoint after a
  transient failure (on a loaded machine, Python workers missing Spark's connect-back timeout).
"""
DEFAULT_OUTPUT = Path("benchmarks/results/latest")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the benchmark scenarios: millstream (every application one fused query; "
        "exactly-once on and off) against the Spark foreachBatch floor, plain Spark and Quix "
        "Streams. Writes each scenario's JSON and PNGs, machine.json, summary.json and "
        "targets.json (the issues' targets on this run's figures, #16's beside the removed "
        "per-computation queries runtime's recorded in benchmarks/results/fused-ab) into "
        "--output."
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes for a CI smoke run (20k events, 1 rate)"
    )
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help=f"results folder ({DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--events", type=int, help="pre-loaded events for throughput and scaling (200000)"
    )
    parser.add_argument("--rates", help="comma-separated input rates in events/s (1000,5000)")
    parser.add_argument(
        "--seconds", type=float, help="seconds of traffic per latency rate (30; quick 15)"
    )
    parser.add_argument(
        "--steady-seconds",
        type=float,
        help="length of the steady memory run (600; quick 150)",
    )
    parser.add_argument(
        "--steady-rate", type=float, default=200.0, help="input rate of the steady run (200/s)"
    )
    parser.add_argument(
        "--driver-read",
        choices=DRIVER_READ_CHOICES,
        default="on",
        help="MILLSTREAM_DRIVER_READ of the millstream pipelines (on); ab: latency, watermarks "
        "and throughput also run their millstream pipeline with it off (off first, then on; "
        "throughput interleaves a millstream-eo-read-off variant), reported side by side; "
        "targets.json is judged on the on figures, each entry carrying the off one",
    )


def _bench_from(args: argparse.Namespace, redis_url: str, bootstrap: str, workdir: Path) -> Bench:
    rates = (
        [float(r) for r in args.rates.split(",") if r.strip()]
        if args.rates
        else ([1000.0] if args.quick else [1000.0, 5000.0])
    )
    events = args.events or (20_000 if args.quick else 200_000)
    seconds = args.seconds or (15.0 if args.quick else 30.0)
    if events < 1000 or not rates or any(not 0 < r <= 50_000 for r in rates) or seconds < 5:
        raise ValueError("--events must be >= 1000, --rates in (0, 50000], --seconds >= 5")
    steady = args.steady_seconds or (150.0 if args.quick else 600.0)
    if steady < 150 or not 0 < args.steady_rate <= 50_000:
        raise ValueError("--steady-seconds must be >= 150 and --steady-rate in (0, 50000]")
    return Bench(
        output=args.output,
        workdir=workdir,
        redis_url=redis_url,
        bootstrap=bootstrap,
        quick=args.quick,
        events=events,
        rates=rates,
        rate_seconds=seconds,
        steady_seconds=steady,
        steady_rate=args.steady_rate,
        driver_read=getattr(args, "driver_read", "on"),
    )


def _driver_read_line(mode: str) -> str:
    """What MILLSTREAM_DRIVER_READ the run's millstream pipelines had (`--driver-read`)."""
    if mode == "ab":
        return (
            "Driver read (`--driver-read ab`): the latency, watermarks and throughput scenarios "
            "ran their millstream pipelines twice in this run, first with "
            "MILLSTREAM_DRIVER_READ=off (the batch collected through Spark, `toArrow()`), then "
            "with it on (the driver reads the batch's Kafka ranges from Spark's offset log). "
            "Rows and keys marked `driver read off` / `_driver_read_off` / `read-off` are the "
            "off runs; everything else, and every target, is the on run. Other scenarios ran "
            "with it on."
        )
    return (
        f"Driver read (`--driver-read {mode}`): every millstream pipeline ran with "
        f"MILLSTREAM_DRIVER_READ={mode}."
    )


def report(output: Path, machine: dict[str, Any], summary: dict[str, Any], images: str = "") -> str:
    """The run's tables in one markdown page, with the command and the machine.

    `images`: prefix of the PNG links (the page may live beside the results folder).
    """
    lines = [
        "# millstream bench results",
        "",
        f"Command: `{machine['command']}`{' (quick sizes)' if summary['quick'] else ''}, "
        f"started {machine.get('started_utc', '?')}. Every figure below comes from that run; "
        f"the JSON files beside the PNGs hold every measured value.",
        "",
        f"Machine: {machine['cores']} cores ({machine['cpu_model']}), {machine['ram_gib']} GiB RAM; "
        f"Python {machine['python']}, Java {machine['java']}, Spark {machine['spark']}, "
        f"Redis {machine['redis']}, broker {machine['kafka_broker']}, "
        f"Quix Streams {machine['quixstreams']}. Load average at start "
        f"{', '.join(f'{x:.1f}' for x in machine['load_average_at_start'])}, at end "
        f"{', '.join(f'{x:.1f}' for x in machine.get('load_average_at_end', []))}; "
        f"total {machine.get('total_seconds')} s.",
        "",
    ]
    source = machine.get("source_at_start")
    if source:
        dirty = source.get("uncommitted_py") or []
        lines += [
            f"Code: commit {source['head'][:10]}"
            + (
                f" plus uncommitted changes to {', '.join(dirty)} (diff sha256 "
                f"{source.get('diff_sha256')}; pipelines import the working tree)."
                if dirty
                else ", clean working tree."
            ),
            "",
        ]
    lines += [line for line in NOTES.strip().splitlines()] + [""]
    for name, entry in summary["scenarios"].items():
        lines.append(f"## {name} ({entry['seconds']} s)")
        lines.append("")
        if not entry["ok"]:
            lines += [f"Failed: `{entry['error']}`", ""]
            continue
        data = json.loads((output / entry["json"]).read_text())
        lines += ["```", data.get("table", "").rstrip(), "```"]
        if data.get("ratios"):
            lines.append("")
            lines.append("Ratios: " + ", ".join(f"{k} = {v}" for k, v in data["ratios"].items()))
        for plot in entry.get("plots", []):
            lines += ["", f"![{name}]({images}{Path(plot).name})"]
        lines.append("")
    targets_file = output / "targets.json"
    if targets_file.exists():
        from millstream.bench.targets import table

        entries = json.loads(targets_file.read_text())
        lines += [
            "## Targets (issues #16, #24, #25, #28; `targets.json`)",
            "",
            table(entries),
            "",
        ]
        lines += [f"- {e['name']}: {e['detail']}" for e in entries] + [""]
    return "\n".join(lines)


def _write_reports(
    output: Path, machine: dict[str, Any], summary: dict[str, Any], *, final: bool
) -> None:
    """`README.md` in the results folder (rewritten after each scenario, so an interrupted run
    keeps what it measured) and, for a full run into the default folder, `../README.md`."""
    (output / "README.md").write_text(report(output, machine, summary))
    if final and output == DEFAULT_OUTPUT and not summary["quick"]:
        page = report(output, machine, summary, images=f"{output.name}/")
        others = sorted(
            d.name
            for d in output.parent.iterdir()
            if d.is_dir() and d != output and (d / "README.md").exists()
        )
        if others:  # runs kept apart (a soak, a profile, a steady run): each says what it is
            page += "\n## Other recorded runs\n\n" + "".join(
                f"- [{name}/]({name}/README.md)\n" for name in others
            )
        (output.parent / "README.md").write_text(page)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from millstream.bench.machine import describe, source_tree
    from millstream.embedded import embedded_services
    from millstream.settings import Settings

    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown or not chosen:
        print(f"millstream bench: unknown scenario {unknown}; use {SCENARIOS}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    state = Path(settings.state_dir).resolve() / "bench"
    workdir = state / "runs" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    args.output.mkdir(parents=True, exist_ok=True)
    folder = state / "embedded"
    bench: Bench | None = None
    machine: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    started = time.monotonic()
    failed = []
    for name in chosen:
        # A scenario's own services where the bench starts them (module doc); yours otherwise.
        with embedded_services(settings, folder) as (redis_url, bootstrap):
            if bench is None:
                try:
                    bench = _bench_from(args, redis_url, bootstrap, workdir)
                except ValueError as exc:
                    print(f"millstream bench: {exc}", file=sys.stderr)
                    return 2
                machine = describe(redis_url, bootstrap, argv if argv is not None else sys.argv[1:])
                machine["started_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                machine["source_at_start"] = source_tree()
                write_json(args.output / "machine.json", machine)
                summary = {
                    "command": machine["command"],
                    "quick": bench.quick,
                    "events": bench.events,
                    "rates": bench.rates,
                    "seconds_per_rate": bench.rate_seconds,
                    "driver_read": bench.driver_read,
                    "scenarios": {},
                }
            else:  # its warm-up topic lived on the last scenario's broker
                bench = dataclasses.replace(
                    bench, redis_url=redis_url, bootstrap=bootstrap, warmup=None
                )
            say(f"--- scenario {name} ---")
            began = time.monotonic()
            module = importlib.import_module(f"millstream.bench.{name}")
            try:
                result = module.run(bench)
                bench.results[name] = result
                entry = {"ok": True, "json": f"{name}.json", "plots": result.get("plots", [])}
            except Exception as exc:
                failed.append(name)
                traceback.print_exc()
                entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            entry["seconds"] = round(time.monotonic() - began, 1)
            summary["scenarios"][name] = entry
            write_json(args.output / "summary.json", summary)
            write_json(args.output / "targets.json", compute_targets(bench.results, failed))
            _write_reports(args.output, machine, summary, final=False)
            if name == chosen[-1]:
                machine["quixstreams"] = describe(redis_url, bootstrap, [])["quixstreams"]
    machine["load_average_at_end"] = list(os.getloadavg())
    machine["total_seconds"] = round(time.monotonic() - started, 1)
    machine["source_at_end"] = source_tree()
    write_json(args.output / "machine.json", machine)
    _write_reports(args.output, machine, summary, final=True)
    print(json.dumps({k: v for k, v in summary["scenarios"].items()}, indent=2))
    if failed:
        print(f"millstream bench: failed scenarios: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"millstream bench: results in {args.output}", file=sys.stderr)
    return 0
