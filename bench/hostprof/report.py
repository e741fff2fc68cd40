#!/usr/bin/env python3
# bench/hostprof/report.py — symbolizes a bench/hostprof/hostprof.cpp dump: report.py DUMP BINARY [LIBS...]
# (unstripped local copies, matched to the dump's mappings by file name) prints the functions with
# the most samples, inclusive and at the leaf, over all threads and over the training step's
# samples (those under Model::forward / backward, Adam or zero_grad).
import sys, collections, subprocess, bisect, os
if len(sys.argv) < 3:
    sys.exit("usage: report.py DUMP BINARY [LIBS...]")
path = sys.argv[1]; bins = sys.argv[2:]  # local copies of binaries/libs by basename
local = {os.path.basename(b): b for b in bins}
samples, maps = [], []
for line in open(path):
    if line.startswith("S "):
        p = line.split(); samples.append((int(p[1]), [int(x, 16) for x in p[2:]]))
    elif line.startswith("M "):
        p = line[2:].split()
        if len(p) >= 6:
            s, e = (int(x, 16) for x in p[0].split("-"))
            maps.append((s, e, int(p[2], 16), p[5]))
maps.sort()
base = {}
for s, e, off, f in maps:
    if off == 0 and f not in base: base[f] = s
starts = [m[0] for m in maps]
def where(pc):
    i = bisect.bisect_right(starts, pc) - 1
    if i < 0 or pc >= maps[i][1]: return None, 0
    f = maps[i][3]; return f, pc - base.get(f, maps[i][0])
addrs = collections.defaultdict(set)
for _, st in samples:
    for k, pc in enumerate(st):
        f, rel = where(pc if k == 0 else pc - 1)
        if f: addrs[f].add(rel)
names = {}
for f, rels in addrs.items():
    b = local.get(os.path.basename(f))
    rels = sorted(rels)
    if b:
        out = subprocess.run(["addr2line", "-f", "-C", "-e", b] + [hex(r) for r in rels], capture_output=True, text=True).stdout.split("\n")
        for i, r in enumerate(rels):
            n = out[2 * i] if 2 * i < len(out) else "??"
            if n == "??":
                n = None
            names[(f, r)] = n
    for r in rels:
        if names.get((f, r)) is None:
            names[(f, r)] = os.path.basename(f)
def sym(pc, leaf):
    f, rel = where(pc if leaf else pc - 1)
    if not f: return "?"
    n = names.get((f, rel), os.path.basename(f))
    return n
per_thread = collections.Counter(t for t, _ in samples)
print("samples", len(samples), "threads", len(per_thread))
stacks = []
for t, st in samples:
    names_ = [sym(pc, k == 0) for k, pc in enumerate(st)]
    i = 0
    while i < len(names_) and ("hostprof" in names_[i] or (i < 3 and names_[i].startswith("libc.so"))):
        i += 1
    stacks.append((t, names_[i:]))
def short(n):
    n = n.replace("gale::", "").replace("(anonymous namespace)::", "")
    return n[:110]
# The training step's samples: stacks through Model::forward / backward, Adam or zero_grad.
cons = [s for t, s in stacks if any(("Model::forward" in x or "Model::backward" in x or "Adam::step" in x or "zero_grad" in x) for x in s)]
print("samples in forward/backward/adam:", len(cons))
for title, sel in (("ALL", [s for _, s in stacks]), ("STEP", cons)):
    inc = collections.Counter(); leaf = collections.Counter()
    for s in sel:
        for n in set(s): inc[short(n)] += 1
        leaf[short(s[0]) if s else "?"] += 1
    print(f"== {title}: inclusive top")
    for n, c in inc.most_common(45): print(f"{c:7d} {100*c/max(1,len(sel)):5.1f}%  {n}")
    print(f"== {title}: leaf top")
    for n, c in leaf.most_common(25): print(f"{c:7d} {100*c/max(1,len(sel)):5.1f}%  {n}")
