"""Options of `millstream demo`."""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoOptions:
    duration: float = 120.0  # seconds of generated traffic
    rate: float = 300.0  # events per second, on average (photon: clicks per second, 100)
    duplicates: float = 0.01  # share of events sent twice
    late: float = 0.002  # share of events sent far behind the watermark
    seed: int = 7
    fault: bool = True  # SIGKILL the pipeline once and restart it
    output: Path = Path("results/demo")
    json: bool = False
    shards: int = 4
    queries: int = 200
    job: str = "zeitgeist"

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["output"] = str(self.output)
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoOptions()
    parser.add_argument(
        "--duration", type=float, default=d.duration, help="seconds of traffic (default 120)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="events per second (default 300); with --job photon, clicks per second (100)",
    )
    parser.add_argument(
        "--job",
        choices=["zeitgeist", "photon"],
        default=d.job,
        help="zeitgeist (default): anomaly detection on query counts; photon: clicks joined "
        "with their queries by two pipelines active-active, one SIGKILLed, one paused",
    )
    parser.add_argument(
        "--duplicates", type=float, default=d.duplicates, help="share sent twice (0.01)"
    )
    parser.add_argument(
        "--late", type=float, default=d.late, help="share sent behind the watermark"
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed (default 7)")
    parser.add_argument(
        "--no-fault", dest="fault", action="store_false", help="do not kill -9 the pipeline"
    )
    parser.add_argument(
        "--output", type=Path, default=d.output, help="folder for plots and reports"
    )
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")
    parser.add_argument("--shards", type=int, default=d.shards, help="shards per computation (4)")
    parser.add_argument("--queries", type=int, default=d.queries, help="vocabulary size (200)")


def from_args(args: argparse.Namespace) -> DemoOptions:
    d = DemoOptions()
    opts = DemoOptions(
        duration=args.duration,
        rate=args.rate if args.rate is not None else (100.0 if args.job == "photon" else d.rate),
        job=args.job,
        duplicates=args.duplicates,
        late=args.late,
        seed=args.seed,
        fault=args.fault,
        output=args.output,
        json=args.json,
        shards=args.shards,
        queries=args.queries,
    )
    if not math.isfinite(opts.duration) or opts.duration < 20:
        raise ValueError("--duration must be at least 20 seconds (spikes and dips need room)")
    if not math.isfinite(opts.rate) or not 0 < opts.rate <= 20_000:
        raise ValueError("--rate must be in (0, 20000]")
    if not 0 <= opts.duplicates < 0.5 or not 0 <= opts.late < 0.1:
        raise ValueError("--duplicates must be in [0, 0.5) and --late in [0, 0.1)")
    if not 1 <= opts.shards <= 256 or not 10 <= opts.queries <= 100_000:
        raise ValueError("--shards must be in [1, 256] and --queries in [10, 100000]")
    return opts
