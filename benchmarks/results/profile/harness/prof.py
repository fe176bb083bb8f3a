import sys, re
from collections import Counter
lines = open(sys.argv[1]).read().splitlines()
tot = Counter(); self_ = Counter(); N = 0
for l in lines:
    stack, n = l.rsplit(" ", 1); n = int(n)
    frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")]
    if not any("worker (daemon.py)" in f for f in frames): continue
    N += n
    for g in set(frames): tot[g] += n
    self_[frames[-1]] += n
print("worker on-CPU samples", N)
print("--- self"); [print(f"{v:5d} {100*v/N:5.1f}% {k[:140]}") for k, v in self_.most_common(30)]
print("--- inclusive"); [print(f"{v:5d} {100*v/N:5.1f}% {k[:140]}") for k, v in tot.most_common(70) if "process " not in k]
