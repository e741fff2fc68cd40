#!/usr/bin/env bash
# Runs the same `gale bench` and `gale predict` commands with two gale binaries and compares what
# they print: in JSON rows every field that is not a time, in tables every line with its numbers
# masked, and predict's predictions byte for byte. For refactors of the commands and of what they
# reach (the twenty-fifth session's splits); scripts/compare-train-runs.sh does the same for training.
#
# usage: scripts/compare-bench-runs.sh BEFORE_GALE AFTER_GALE WORKDIR [cpu|cuda]
# Makes its store in WORKDIR with BEFORE_GALE (an R-MAT graph; scale 12 on the CPU, 18 on a GPU) and a
# checkpoint to predict from. Prints one line per case, "same" or "DIFFERENT" with the first
# differences; exits 1 when any case differs or either side fails (every case must succeed).
#
# Some fields differ between two runs of the same binary on a GPU: kernels that sum with atomics
# (GAR, GAS, MaxK's) against cuSPARSE (max_abs_err, rel_err), and losses of the GPU sampler's
# batches in their last digits. They are compared within NOISE (relative, default 0.5) and 1e-5,
# and reported when they pass it; run BEFORE against itself to see the noise.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BEFORE_GALE AFTER_GALE WORKDIR [cpu|cuda]" >&2; exit 2; }
before=$1 after=$2 work=$3 device=${4:-cpu}
case $device in cpu|cuda) ;; *) echo "$0: expected cpu or cuda, found '$device'" >&2; exit 2 ;; esac
mkdir -p "$work"
scale=12; [ "$device" = cuda ] && scale=18
store=$work/rmat$scale.gale
[ -f "$store/manifest.json" ] ||
  "$before" preprocess --generate rmat:scale=$scale,edge-factor=16,classes=7,feature-dim=32 -o "$store" >/dev/null
ck=$work/ck
[ -f "$ck/best.ckpt" ] || "$before" train "$store" --model sage --hidden 32 --fanouts 5,5 --epochs 1 --eval none \
  --device "$device" --checkpoint-dir "$ck" -q >/dev/null

cases=(
  "train-json|bench train $store --models gcn,sage,gin,gat --hidden 16 --epochs 1 --warmup 0 --json --device $device"
  "train-table|bench train $store --models sage,gin --hidden 16 --epochs 1 --warmup 0 --norm batch --device $device"
  "sample|bench sample $store --samplers cpu --batches 3 --warmup 1 --json"
  "pipeline|bench pipeline $store --device $device --epochs 1 --warmup 0 --layers 2 --hidden 16 --fanouts 5,5 --json"
  "predict|predict $store --checkpoint $ck --device $device"
  "predict-sampled|predict $store --checkpoint $ck --device $device --fanouts 5,5"
)
if [ "$device" = cuda ]; then
  cases+=(
    "spmm|bench spmm $store --dims 32,100 --kernels cusparse,gar,gas,memory-aware,auto,gar-scan,sampled:8,tc --runs 3 --warmup 1 --json"
    "spmm-table|bench spmm $store --dims 64 --kernels cusparse,gar,tc --runs 3 --warmup 1"
    "maxk|bench spmm $store --maxk 16,32 --dims 64 --runs 3 --warmup 1 --json"
    "sample-gpu|bench sample $store --samplers gpu,gpu-blocks,gpu-inputs --batches 3 --warmup 1 --json"
    "gather|bench gather $store --batches 3 --warmup 1 --json"
    "predict-layers|predict $store --checkpoint $ck --device cuda --gpu-mem-budget 48M --spmm memory-aware"
  )
fi

status=0
for c in "${cases[@]}"; do
  name=${c%%|*} args=${c#*|}
  codes=()
  for side in before after; do
    bin=$before; [ $side = after ] && bin=$after
    out=$work/$name-$side
    extra=""; case $args in predict*) extra="--out $out.npy" ;; esac
    # shellcheck disable=SC2086
    set +e; "$bin" $args $extra > "$out.txt" 2>&1; codes+=($?); set -e
    sed -i "s#$out.npy#OUT.npy#g" "$out.txt"
  done
  verdict=$(python3 - "$work/$name-before" "$work/$name-after" "${codes[0]}" "${codes[1]}" "${NOISE:-0.5}" <<'PY'
import json, os, re, sys
a_base, b_base, code_a, code_b, noise = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
bad, noisy = [], []
if code_a != '0' or code_b != '0':  # every case is a run that must succeed
    bad.append(f"exit {code_a} vs {code_b}: " + open(b_base + '.txt').read().strip().splitlines()[-1][:160])
def rows(path):
    return [json.loads(l) for l in open(path) if l.startswith('{')]
def timeish(k):
    return any(t in k for t in ('ms', 'gbps', 'per_s', 'speedup', 'efficiency', 'bound', 'peak', 'time')) or k.endswith('_s')
ta, tb = open(a_base + '.txt').read(), open(b_base + '.txt').read()
ra, rb = rows(a_base + '.txt'), rows(b_base + '.txt')
if ra or rb:
    if len(ra) != len(rb):
        bad.append(f"{len(ra)} rows vs {len(rb)}")
    for i, (x, y) in enumerate(zip(ra, rb)):
        if set(x) != set(y):
            bad.append(f"row {i}: keys {sorted(set(x) ^ set(y))}")
        for k in sorted(set(x) & set(y)):
            u, v = x[k], y[k]
            if u == v or timeish(k):
                continue
            if isinstance(u, (int, float)) and isinstance(v, (int, float)) and ('err' in k or k == 'loss'):
                if abs(u - v) <= 1e-5 + noise * max(abs(u), abs(v)):
                    noisy.append(f"{k} {u:.3g}/{v:.3g}")
                    continue
            bad.append(f"row {i} {k}: {u!r} vs {v!r}")
    ta = '\n'.join(l for l in ta.splitlines() if not l.startswith('{'))
    tb = '\n'.join(l for l in tb.splitlines() if not l.startswith('{'))
mask = lambda t: [re.sub(r'\s+', ' ', re.sub(r'[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?', '#', l)).strip() for l in t.splitlines()]
la, lb = mask(ta), mask(tb)
if la != lb:
    diff = [f"{p!r} vs {q!r}" for p, q in zip(la, lb) if p != q] or [f"{len(la)} lines vs {len(lb)}"]
    bad.append("text: " + diff[0])
if os.path.exists(a_base + '.npy') or os.path.exists(b_base + '.npy'):
    try:
        same = open(a_base + '.npy', 'rb').read() == open(b_base + '.npy', 'rb').read()
    except OSError as e:
        same = False
    if not same:
        bad.append("predictions differ")
if bad:
    print("DIFFERENT: " + "; ".join(bad[:4]))
else:
    print("same" + (f" (within the noise: {', '.join(noisy[:3])})" if noisy else ""))
PY
)
  case $verdict in same*) ;; *) status=1 ;; esac
  printf '%-16s %s\n' "$name" "$verdict"
done
exit $status
