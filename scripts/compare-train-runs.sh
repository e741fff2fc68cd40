#!/usr/bin/env bash
# Runs the same deterministic training commands with two gale binaries and compares what they
# leave: every metrics line with its timings removed, and the checkpoints' bytes (weights, Adam
# moments, bookkeeping). For refactors that must not change behaviour (issue 41's split of train()).
#
# usage: scripts/compare-train-runs.sh BEFORE_GALE AFTER_GALE WORKDIR [cpu|cuda]
# Makes its stores in WORKDIR with BEFORE_GALE, so that both binaries read them: a small
# planted-partition graph with 2 parts, and tests/data/cora. Prints one line per case with the two
# checksums and "same" or "DIFFERENT"; exits 1 when any case differs.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BEFORE_GALE AFTER_GALE WORKDIR [cpu|cuda]" >&2; exit 2; }
before=$1 after=$2 work=$3 device=${4:-cpu}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
sbm=$work/sbm.gale cora=$work/cora.gale
[ -d "$sbm" ] || "$before" preprocess --generate sbm:nodes=20K,classes=8,avg-degree=10,feature-dim=32,seed=3 \
  -o "$sbm" --partitions 2 >/dev/null
[ -d "$cora" ] || "$before" preprocess "$here/tests/data/cora" -o "$cora" --normalize-features row >/dev/null
common="--deterministic -q --device $device --seed 7"
gpu_sampler=""
[ "$device" = cuda ] && gpu_sampler="--sampler cpu"  # the GPU sampler's local ids follow its threads
cases=(
  "full-graph-gcn|$cora --model gcn --hidden 16 --epochs 6"
  "full-graph-gat|$cora --model gat --hidden 8 --heads 4 --epochs 3"
  "full-graph-sage-plateau|$cora --model sage --hidden 16 --epochs 8 --lr-schedule plateau:1:0.5 --patience 4"
  "minibatch-sage|$sbm --model sage --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 3 $gpu_sampler"
  "minibatch-gcn-window|$sbm --model gcn --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 2 --reorder-window 4 $gpu_sampler"
  "minibatch-eval-batched|$sbm --model sage --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 2 --eval batched $gpu_sampler"
)
if [ "$device" = cpu ]; then
  cases+=("minibatch-2-workers|$sbm --model sage --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 2 --workers 2 --check-replicas")
  cases+=("minibatch-2-workers-slices|$cora --model gcn --hidden 16 --fanouts 5,5 --batch-size 64 --epochs 2 --workers 2")
  # The disk tier: 128 MiB of the budget is IO staging, so the 2.5 MB of features go to disk.
  cases+=("minibatch-disk|$sbm --model sage --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 2 --host-mem-budget 130M")
  cases+=("minibatch-disk-sampled-rank|$sbm --model sage --hidden 32 --fanouts 5,5 --batch-size 512 --epochs 2 --host-mem-budget 130M --cache-rank sampled")
fi
status=0
for c in "${cases[@]}"; do
  name=${c%%|*} args=${c#*|}
  sums=()
  for side in before after; do
    bin=$before; [ $side = after ] && bin=$after
    d=$work/$name-$side; rm -rf "$d"; mkdir -p "$d"
    # shellcheck disable=SC2086
    "$bin" train $args $common --metrics "$d/metrics.jsonl" --checkpoint-dir "$d/ck" > "$d/stdout" 2> "$d/stderr" ||
      { echo "$name: $side failed: $(tail -1 "$d/stderr")"; status=1; continue 2; }
    python3 - "$d/metrics.jsonl" > "$d/metrics.notimes" <<PY
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    # Times (every key ending in _s, worker_stage_s's table of them too) and the GPU pool's figures.
    for k in [k for k in j if k.endswith("_s")] + ["gpu_peak_bytes", "gpu_allocations"]:
        j.pop(k, None)
    print(json.dumps(j, sort_keys=True))
PY
    sums+=("$(cat "$d/metrics.notimes" "$d/ck/latest.ckpt" "$d/ck/best.ckpt" "$d/stdout" | sha256sum | cut -c1-16)")
  done
  verdict=same; [ "${sums[0]}" = "${sums[1]}" ] || { verdict=DIFFERENT; status=1; }
  printf '%-28s before %s  after %s  %s\n' "$name" "${sums[0]}" "${sums[1]}" "$verdict"
done
exit $status
