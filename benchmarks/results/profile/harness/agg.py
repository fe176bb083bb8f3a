import sys, json
sys.path.insert(0, "/tmp/perf")
from analyze import analyze
from collections import defaultdict
keys = ["progress.triggerExecution","progress.addBatch","progress.latestOffset","progress.walCommit","progress.commitOffsets","progress.queryPlanning",
        "batch.spark_jobs","source.wall","source.fetch","source.active","route.wall","route.input_wait","route.own","route.downstream","route_arrow.own",
        "shard_task.input_deser","shard_task.run_shard","shard.acquire","shard.to_record","shard.dedup","shard.load","shard.user_code","shard.commit_prep","shard.commit",
        "shard.deliver","txn_init.s","txn_progress.s","txn.s","shard.ack"]
for path in sys.argv[1:]:
    res = analyze(path)
    tot = defaultdict(float); N = 0; nb = 0
    for app, r in res.items():
        N += r["records"]; nb += r["batches"]
        for k, v in r.items():
            if isinstance(v, dict): tot[k] += v["s_total"]
    print(f"{path}: {len(res)} runs, {N} records, {nb} batches (incl. empty)")
    for k in keys:
        if k in tot: print(f"   {k:28s} {1e6*tot[k]/N:8.1f} us/rec")
