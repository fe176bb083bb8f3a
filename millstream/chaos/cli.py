"""`millstream chaos`: options, validation, and the exit code (0 only when exactly-once held)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from millstream.chaos.run import ChaosOptions, run_chaos, text_report
from millstream.testing.faults import FAULT_KINDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ChaosOptions()
    parser.add_argument(
        "--duration", type=float, default=d.duration, help="seconds of traffic (120)"
    )
    parser.add_argument("--rate", type=float, default=d.rate, help="events per second (100)")
    parser.add_argument("--keys", type=int, default=d.keys, help="distinct keys (50)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the fault schedule (7)")
    parser.add_argument("--every", type=float, default=d.every, help="seconds between faults (20)")
    parser.add_argument(
        "--faults",
        default=",".join(d.faults),
        help=f"comma-separated fault kinds from {','.join(FAULT_KINDS)} "
        "(default: all but restart-broker, which needs --broker durable)",
    )
    parser.add_argument(
        "--broker",
        choices=["memory", "durable"],
        default=d.broker,
        help="memory (default; broker-outage through a proxy) or durable (Tansu on S3, for "
        "restart-broker; slow storage: use --rate 20)",
    )
    parser.add_argument("--shards", type=int, default=d.shards, help="shards per computation (4)")
    parser.add_argument("--output", type=Path, default=d.output, help="folder for logs and reports")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def from_args(args: argparse.Namespace) -> ChaosOptions:
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(
            f"--faults: unknown kind {unknown[0]!r}; choose from {', '.join(FAULT_KINDS)}"
        )
    if not math.isfinite(args.duration) or args.duration < 10:
        raise ValueError("--duration must be at least 10 seconds")
    if not math.isfinite(args.rate) or not 0 < args.rate <= 20_000:
        raise ValueError("--rate must be in (0, 20000]")
    if not math.isfinite(args.every) or args.every < 5:
        raise ValueError("--every must be at least 5 seconds (a restart needs time to recover)")
    if not 1 <= args.keys <= 100_000 or not 1 <= args.shards <= 256:
        raise ValueError("--keys must be in [1, 100000] and --shards in [1, 256]")
    if "restart-broker" in kinds and args.broker != "durable":
        raise ValueError("--faults restart-broker needs --broker durable")
    return ChaosOptions(
        duration=args.duration,
        rate=args.rate,
        keys=args.keys,
        seed=args.seed,
        every=args.every,
        faults=kinds,
        broker=args.broker,
        shards=args.shards,
        output=args.output,
    )


def main(args: argparse.Namespace) -> int:
    try:
        opts = from_args(args)
    except ValueError as exc:
        print(f"millstream chaos: {exc}", file=sys.stderr)
        return 2
    summary = run_chaos(opts)
    print(json.dumps(summary, indent=2) if args.json else text_report(summary))
    return 0 if summary["passed"] else 1
