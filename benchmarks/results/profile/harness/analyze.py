import json, sys, statistics as st
from collections import defaultdict

def load(path):
    return [json.loads(l) for l in open(path)]

def analyze(path, app=None):
    recs = load(path)
    apps = []
    for r in recs:
        if r["kind"] == "batch" and r["app"] not in apps:
            apps.append(r["app"])
    out = {}
    for app in (apps[1:] if app is None else [app]):  # skip warm-up
        b = [r for r in recs if r["kind"] == "batch" and r["app"] == app]
        prog = [r for r in recs if r["kind"] == "progress" and r["name"].startswith(app) and r["rows"] > 0]
        lo = min(r["t"] - r["plan"] - r["spark_jobs"] - r["after"] for r in b) - 0.01
        hi = max(r["t"] for r in b) + 0.01
        w = [r for r in recs if lo <= r["t"] <= hi]
        N = sum(r["records"] for r in b)
        d = defaultdict(float)
        for p in prog:
            for k, v in p["duration"].items():
                d["progress." + k] += v / 1000
        for r in b:
            for k in ("plan", "spark_jobs", "shard_task_max", "shard_task_sum", "after"):
                d["batch." + k] += r[k]
        for r in w:
            if r["kind"] == "source_read":
                d["source.wall"] += r["wall_s"]; d["source.active"] += r["active_s"]; d["source.fetch"] += r["fetch_s"]; d["source.rows"] += r["rows"]
            elif r["kind"] == "route":
                d["route.wall"] += r["wall_s"]; d["route.input_wait"] += r["input_s"]; d["route.own"] += r["own_s"]; d["route.downstream"] += r["downstream_s"]; d["route.rows"] += r["rows"]
            elif r["kind"] in ("txn_init", "txn_progress", "txn"):
                d[r["kind"] + ".s"] += r["s"]; d[r["kind"] + ".count"] += 1
            elif r["kind"] == "route_arrow":
                d["route_arrow.own"] += r["own_s"]; d["route_arrow.rows"] += r["rows"]
            elif r["kind"] == "shard_task":
                d["shard_task.input_deser"] += r["input_s"]; d["shard_task.run_shard"] += r["run_s"]
            elif r["kind"] == "shard":
                for k, v in r["phases"].items():
                    d["shard." + k] += v
                d["shard.round_trips"] += r["round_trips"]
        nb = len(b)
        res = {"batches": nb, "records": N}
        for k, v in sorted(d.items()):
            if k.endswith("rows") or k.endswith("round_trips") or k.endswith("count"):
                res[k] = v
            else:
                res[k] = {"s_total": round(v, 3), "ms_per_batch": round(1000 * v / nb, 1), "us_per_rec": round(1e6 * v / max(N, 1), 1)}
        out[app] = res
    return out

if __name__ == "__main__":
    for app, res in analyze(sys.argv[1]).items():
        print("==", app, res["batches"], "batches", res["records"], "records")
        for k, v in res.items():
            if isinstance(v, dict):
                print(f"  {k:32s} total {v['s_total']:8.3f}s  {v['ms_per_batch']:8.1f} ms/batch  {v['us_per_rec']:8.1f} us/rec")
            elif k not in ("batches", "records"):
                print(f"  {k:32s} {v}")
