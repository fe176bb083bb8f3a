import json, sys, statistics as st
from datetime import datetime
def ts(s): return datetime.strptime(s.replace("GMT",""), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
d = json.load(open(sys.argv[1])); minrec = int(sys.argv[2])
stages = {s["stageId"]: s for s in d["stages"] if s["status"] == "COMPLETE"}
jobs = sorted(d["jobs"], key=lambda j: j["jobId"])
# batches: map stage (inputRecords >= minrec) and the following result stage (shuffleReadRecords >= minrec)
m = [s for s in stages.values() if s["inputRecords"] >= minrec]
r = []
for ms in m:
    nxt = [s for s in stages.values() if s["stageId"] > ms["stageId"] and s["numTasks"] == 8]
    if nxt: r.append(min(nxt, key=lambda s: s["stageId"]))
def span(a, b): return ts(b["completionTime"]) - ts(a["submissionTime"])
pairs = list(zip(m, r))
def dur(s): return ts(s["completionTime"]) - ts(s["submissionTime"])
print(sys.argv[1], "map stages", len(m), "median dur %.3f" % st.median(map(dur, m)), "run_ms med", st.median(s["executorRunTime"] for s in m), "jvm_cpu_ms med", st.median(s["executorCpuTime"]//10**6 for s in m), "shuffle bytes", st.median(s["shuffleWriteBytes"] for s in m))
print(sys.argv[1], "shard stages", len(r), "median dur %.3f" % st.median(map(dur, r)), "run_ms med", st.median(s["executorRunTime"] for s in r))
# job wall incl. gaps for data batches
print(sys.argv[1], "map-start -> shard-end median %.3f" % st.median(span(a, b) for a, b in pairs))
