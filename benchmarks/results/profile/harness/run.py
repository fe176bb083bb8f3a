"""A/B throughput runner: python run.py --events N --cap C --plans rdd,arrow --reps 3"""
from __future__ import annotations

import argparse, json, os, sys, time, uuid
from pathlib import Path

from millstream.bench._harness import Bench, metric, millstream_pipeline, say
from millstream.bench._workload import new_topic, preload
from millstream.bench.throughput import _follow, warmup_topic
from millstream.embedded import embedded_services
from millstream.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=30000)
    ap.add_argument("--cap", type=int, default=3000)
    ap.add_argument("--plans", default="rdd")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--tag", default="x")
    ap.add_argument("--hold", type=float, default=0, help="seconds to keep the last process up")
    a = ap.parse_args()
    os.environ.pop("REDIS_URL", None); os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    settings = Settings.from_env()
    out = Path("/tmp/perf/out"); work = Path("/tmp/perf/work") / a.tag
    work.mkdir(parents=True, exist_ok=True)
    with embedded_services(settings, Path("/tmp/perf/embedded")) as (redis_url, bootstrap):
        bench = Bench(output=out, workdir=work, redis_url=redis_url, bootstrap=bootstrap,
                      quick=False, events=a.events, rates=[1000.0], rate_seconds=5)
        topic = new_topic(bench.kafka, "perf")
        preload(bench.kafka, topic, a.events)
        warm_events = 2 * a.cap
        warm_topic = warmup_topic(bench, warm_events)
        client = bench.redis()
        results = []
        for plan in a.plans.split(","):
            def cfg(source, n):
                app = f"pf-{uuid.uuid4().hex[:8]}"
                part = {"name": "window_counter", "what": "window", "exactly_once": True,
                        "output_topic": new_topic(bench.kafka, f"{app}-out")}
                return {"app": app, "bootstrap": bootstrap, "input_topic": source,
                        "shards": a.shards, "parts": [part], "events": n}
            warm = cfg(warm_topic, warm_events)
            runs = [cfg(topic, a.events) for _ in range(a.reps)]
            folder = bench.run_dir(f"{a.tag}-{plan}")
            log = f"/tmp/perf/out/{a.tag}-{plan}.jsonl"
            if os.path.exists(log):
                os.remove(log)
            os.environ["PERF_LOG"] = log
            os.environ["PERF_PLAN"] = plan
            series = {"app": warm["app"], "runs": [warm, *runs], "events": a.events}
            with millstream_pipeline(bench, series, folder, master="local[2]", max_batch=a.cap) as proc:
                proc.wait_for("warm-up", lambda: metric(client, warm["app"], "window_counter", "records") >= warm_events, 900)
                since = time.monotonic()
                for r in runs:
                    app = r["app"]
                    res = _follow(proc, lambda app=app: metric(client, app, "window_counter", "records"),
                                  lambda app=app: metric(client, app, "window_counter", "records") >= a.events,
                                  a.events, 900, since)
                    since = time.monotonic()
                    res.update(plan=plan, app=app, cap=a.cap, batches=metric(client, app, "window_counter", "batches"),
                               duplicates=metric(client, app, "window_counter", "duplicates"),
                               delivered=metric(client, app, "window_counter", "delivered"))
                    say(json.dumps(res))
                    results.append(res)
                if a.hold:
                    time.sleep(a.hold)
                try:
                    import urllib.request
                    ui = [json.loads(l) for l in open(log) if '"kind": "ui"' in l][0]
                    base = f"{ui['url']}/api/v1/applications/{ui['app_id']}"
                    dump = {}
                    for what in ("jobs", "stages?withSummaries=true&quantiles=0.5"):
                        with urllib.request.urlopen(f"{base}/{what}", timeout=30) as f:
                            dump[what.split("?")[0]] = json.load(f)
                    Path(f"/tmp/perf/out/{a.tag}-{plan}-spark.json").write_text(json.dumps(dump))
                except Exception as exc:
                    say(f"REST dump failed: {exc!r}")
        Path(f"/tmp/perf/out/{a.tag}-results.json").write_text(json.dumps(results, indent=2))
        for r in results:
            print(r["plan"], r["cap"], r["events_per_s"], r["steady_s"], r["batches"], r["duplicates"], r["delivered"])


if __name__ == "__main__":
    main()
