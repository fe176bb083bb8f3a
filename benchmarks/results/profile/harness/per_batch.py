import json, sys, statistics as st
for path in sys.argv[1:]:
    recs = [json.loads(l) for l in open(path)]
    apps = []
    for r in recs:
        if r["kind"] == "batch" and r["app"] not in apps: apps.append(r["app"])
    b = [r for r in recs if r["kind"] == "batch" and r["app"] in apps[1:] and r["records"] > 0]
    p = [r for r in recs if r["kind"] == "progress" and any(r["name"].startswith(a) for a in apps[1:]) and r["rows"] > 0]
    ti = [r for r in recs if r["kind"] == "txn_init"]; tx = [r for r in recs if r["kind"] == "txn"]
    print(path, "data batches", len(b), "median spark_jobs %.3f" % st.median(r["spark_jobs"] for r in b),
          "median triggerExecution %.3f" % (st.median(r["duration"]["triggerExecution"] for r in p)/1000),
          "median addBatch %.3f" % (st.median(r["duration"]["addBatch"] for r in p)/1000),
          "non-addBatch %.3f" % (st.median(r["duration"]["triggerExecution"]-r["duration"]["addBatch"] for r in p)/1000),
          "shard_task_max %.3f" % st.median(r["shard_task_max"] for r in b),
          "txn_init/txn %d/%d" % (len(ti), len(tx)))
