#!/usr/bin/env bash
# Multi-GPU scaling of mini-batch training (issue 38): SAGE 3x256, fanouts 15,10,5, batch 1024
# per GPU, --eval none, on 1, 2 and 4 GPUs, in one process (one worker thread per GPU, --gpus
# LIST), as one process per GPU (mpirun --bind-to none, --gpus all, CUDA_VISIBLE_DEVICES), and as
# one process per GPU that gale starts itself (--processes per-gpu, no mpirun),
# for each worker-thread policy (GALE_WORKER_THREADS: pinned, arenas, shared; engine/worker_arena.hpp).
#
# usage: bench/multigpu_scaling.sh DIST|GALE STORE [-- GALE_TRAIN_OPTIONS...]
#
#   DIST   a bundle of scripts/gpu-bundle.sh (bin/gale, lib/), or a gale binary
#   STORE  a Gale store, or a path where none exists yet: the store is generated there (R-MAT scale
#          MGS_SCALE, default 23, edge factor 16, 47 classes, 100-d features: gpu-checks.sh multigpu's)
#
# Environment (every one optional):
#   MGS_GPUS="1 2 4"            worker counts; counts above the machine's GPUs are skipped, 1 always runs
#   MGS_LAYOUTS="threads procs launched"  threads: one process; procs: N processes of one GPU each
#                               (needs mpirun); launched: the same started by gale train --processes
#   MGS_POLICIES="pinned shared"  GALE_WORKER_THREADS values, each layout and count run under each
#   MGS_EPOCHS=4                epochs per run (>= 2): the first warms up, the table takes the median of the rest
#   MGS_CHECK_REPLICAS=1        --check-replicas (0: off)
#   MGS_HOSTPROF=1              preload bench/hostprof (DIST/lib/libgale_hostprof.so) into the runs of one
#                               process; dumps go to OUT/prof-RUN.PID (bench/hostprof/report.py)
#   MGS_CPU=1                   CPU workers (--device cpu --workers N) instead of GPUs: tests this script
#   MGS_DRY_RUN=1               print the commands, run nothing
#   OUT=DIR                     logs and metrics (default: a new directory under /tmp, kept)
#
# Prints nvidia-smi topo -m and the NUMA layout, then per run a line as it ends, then two tables:
# seeds per second (median over the epochs after the first) with the speed-up over the 1-GPU run of
# the same policy, two ways: the epoch's seeds over the epoch's seconds (what a user waits for) and
# the sum of every worker's rate over its own time (which leaves out the epoch's set-up before the
# workers start: until the seventeenth session the only figure, and the plan's dealing of every
# step by in-degree, 0.1-0.25 s an epoch on one thread, hid there); and every worker's seconds by stage per epoch
# (median): prepare (sampling and host feature reads), of which host feature reads, load, io (GPU
# time of the IO stream), compute (the step's host time, which includes enqueueing the sums and
# reading the votes), wait (for a prepared batch), allreduce (GPU time of NCCL sums), sum_wait (GPU
# time the compute stream stalled for the sums: what they and the slowest worker cost), wall. A stage
# that grows from 1 to N GPUs is where the workers get in each other's way.
# Exit status: 0 when every run succeeded, 1 when one failed (the table marks it), 2 for bad usage.
set -uo pipefail
usage="usage: $0 DIST|GALE STORE [-- GALE_TRAIN_OPTIONS...]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
target=$1 store=$2
shift 2
if [ $# -gt 0 ]; then
  [ "$1" = -- ] || { echo "$0: unexpected '$1' ($usage)" >&2; exit 2; }
  shift
fi
extra=("$@")

if [ -d "$target" ]; then
  dist=$(cd "$target" && pwd)
  gale=$dist/bin/gale
  export LD_LIBRARY_PATH="$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  hostprof_lib=$dist/lib/libgale_hostprof.so
else
  gale=$(cd "$(dirname "$target")" && pwd)/$(basename "$target")
  hostprof_lib=$(dirname "$gale")/../lib/libgale_hostprof.so
fi
[ -x "$gale" ] || { echo "$0: $gale: not an executable gale binary" >&2; exit 2; }
if [ -e "$store" ] && [ ! -f "$store/manifest.json" ]; then
  echo "$0: $store exists but is not a Gale store (no manifest.json); give a store, or a path to generate one at" >&2
  exit 2
fi

gpus_wanted=${MGS_GPUS:-1 2 4}
layouts=${MGS_LAYOUTS:-threads procs launched}
policies=${MGS_POLICIES:-pinned shared}
epochs=${MGS_EPOCHS:-4}
cpu=${MGS_CPU:-0}
dry=${MGS_DRY_RUN:-0}
for g in $gpus_wanted; do [[ $g =~ ^[1-9][0-9]*$ ]] || { echo "$0: MGS_GPUS: expected counts such as '1 2 4', found '$g'" >&2; exit 2; }; done
for l in $layouts; do [[ $l =~ ^(threads|procs|launched)$ ]] || { echo "$0: MGS_LAYOUTS: expected threads, procs and/or launched, found '$l'" >&2; exit 2; }; done
for p in $policies; do [[ $p =~ ^(pinned|arenas|shared)$ ]] || { echo "$0: MGS_POLICIES: expected pinned, arenas or shared, found '$p'" >&2; exit 2; }; done
if ! [[ $epochs =~ ^[0-9]+$ ]] || [ "$epochs" -lt 2 ]; then echo "$0: MGS_EPOCHS: expected 2 or more (the first warms up), found '$epochs'" >&2; exit 2; fi
command -v python3 > /dev/null || { echo "$0: python3 is needed for the tables" >&2; exit 2; }
out=${OUT:-$(mktemp -d /tmp/gale-mgs.XXXXXX)}
mkdir -p "$out" || { echo "$0: OUT=$out: cannot create it" >&2; exit 2; }
echo "gale: $gale"
echo "logs and metrics: $out"

if [ "$cpu" = 1 ]; then
  available=$(nproc)
else
  command -v nvidia-smi > /dev/null || { echo "$0: nvidia-smi not found (MGS_CPU=1 measures CPU workers instead)" >&2; exit 2; }
  available=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
  [ "$available" -ge 1 ] || { echo "$0: nvidia-smi lists no GPU" >&2; exit 2; }
  nvidia-smi -L
  echo "== nvidia-smi topo -m"
  nvidia-smi topo -m 2>&1
fi
echo "== NUMA"
lscpu 2> /dev/null | grep -E '^(CPU\(s\)|Thread\(s\) per core|Socket\(s\)|NUMA)' || echo "(lscpu unavailable)"

counts=()
for g in $gpus_wanted; do
  if [ "$g" -gt "$available" ]; then echo "skipped: $g workers (the machine has $available $([ "$cpu" = 1 ] && echo CPUs || echo GPUs))"
  else counts+=("$g"); fi
done
[[ " ${counts[*]} " == *" 1 "* ]] || counts=(1 "${counts[@]}")  # the baseline of every speed-up

if [[ " $layouts " == *" procs "* ]] && ! command -v mpirun > /dev/null; then
  echo "skipped: the procs layout (no mpirun on PATH)"
  layouts=${layouts//procs/}
fi

if [ ! -e "$store" ]; then
  spec=rmat:scale=${MGS_SCALE:-23},edge-factor=16,classes=47,feature-dim=100
  echo "generating $spec into $store"
  if [ "$dry" = 1 ]; then echo "+ $gale preprocess --generate $spec -o $store --force"
  else
    start=$SECONDS
    "$gale" preprocess --generate "$spec" -o "$store" --force > "$out/generate.log" 2>&1 ||
      { echo "$0: generating the store failed:" >&2; tail -5 "$out/generate.log" >&2; exit 1; }
    echo "generated in $((SECONDS - start)) s"
  fi
fi

# shellcheck disable=SC2054  # the fanouts' commas are gale's
# Every GALE_ and NCCL_ setting of this shell (GALE_UPDATE_OVERLAP, NCCL_MAX_NCHANNELS, ...) reaches each rank.
forwarded=()
for v in $(compgen -e | grep -E '^(GALE|NCCL)_' | grep -v '^GALE_WORKER_THREADS$'); do forwarded+=(-x "$v"); done
common=(train "$store" --model sage --layers 3 --hidden 256 --fanouts 15,10,5 --batch-size 1024 --epochs "$epochs"
        --eval none --lr 0.003 --dropout 0 -q)
[ "${MGS_CHECK_REPLICAS:-1}" = 1 ] && common+=(--check-replicas)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
runs=()

run() {  # name, policy, command...: one run, its metrics in $out/NAME.jsonl
  local name=$1 policy=$2
  shift 2
  rm -f "$out/$name.jsonl"
  if [ "$dry" = 1 ]; then
    echo "+ GALE_WORKER_THREADS=$policy $*"
    return
  fi
  local start=$SECONDS rc=0
  GALE_WORKER_THREADS=$policy "$@" --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    printf '%-24s ok      %4ds\n' "$name" $((SECONDS - start))
  else
    failed=1
    printf '%-24s FAILED (exit %d) after %ds; the log ends:\n' "$name" $rc $((SECONDS - start))
    tail -5 "$out/$name.log" | sed 's/^/    /'
  fi
  runs+=("$name")
}

for policy in $policies; do
  for n in "${counts[@]}"; do
    for layout in $layouts; do
      [ "$layout" != threads ] && [ "$n" -eq 1 ] && continue  # one process of one GPU is the threads run
      name=$layout-$policy-$n
      if [ "$cpu" = 1 ]; then
        workers=(--device cpu --workers "$n") one=(--device cpu)
      else
        workers=(--gpus "$(seq -s, 0 $((n - 1)))") one=(--gpus all)
      fi
      if [ "$layout" = threads ]; then
        prof=()
        if [ "${MGS_HOSTPROF:-0}" = 1 ]; then
          [ -f "$hostprof_lib" ] || { echo "$0: MGS_HOSTPROF=1: $hostprof_lib not found" >&2; exit 2; }
          prof=(env HOSTPROF_OUT="$out/prof-$name" HOSTPROF_US=1000 LD_PRELOAD="$hostprof_lib")
        fi
        run "$name" "$policy" "${prof[@]}" "$gale" "${common[@]}" "${workers[@]}" "${extra[@]}"
      elif [ "$layout" = launched ] && [ "$cpu" = 1 ]; then
        run "$name" "$policy" "$gale" "${common[@]}" "${one[@]}" --processes "$n" "${extra[@]}"
      elif [ "$layout" = launched ]; then
        run "$name" "$policy" env CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))" "$gale" "${common[@]}" "${one[@]}" \
          --processes per-gpu "${extra[@]}"
      elif [ "$cpu" = 1 ]; then
        run "$name" "$policy" mpirun -np "$n" --bind-to none -x GALE_WORKER_THREADS "${forwarded[@]}" "$gale" "${common[@]}" "${one[@]}" "${extra[@]}"
      else
        run "$name" "$policy" env CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))" mpirun -np "$n" --bind-to none \
          -x GALE_WORKER_THREADS -x CUDA_VISIBLE_DEVICES "${forwarded[@]}" "$gale" "${common[@]}" "${one[@]}" "${extra[@]}"
      fi
    done
  done
done
[ "$dry" = 1 ] && exit 0

python3 - "$out" "${runs[@]}" <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]

def epochs(name):
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip() and '"final"' not in l]
    except (OSError, ValueError):
        return None
    return rows[1:] or rows or None  # the first epoch warms up

def med(values):
    values = list(values)
    return statistics.median(values) if values else float("nan")

runs = {n: epochs(n) for n in names}

def epoch_rate(r):  # the epoch's seeds (every worker's rate x its time) over the epoch's own seconds
    seeds = sum(x * t for x, t in zip(r.get("worker_seeds_per_s", []), r.get("worker_stage_s", {}).get("wall", [])))
    return seeds / r["epoch_s"] if r.get("epoch_s") else float("nan")

base, base_workers = {}, {}  # policy -> the 1-worker run's seeds/s, by epoch time and by the workers' own
print(f"\n== seeds per second (median over epochs 2..): the epoch's seeds over its seconds, and the sum of the"
      f"\n   workers' rates over their own time (without the epoch's set-up between them); speed-ups over 1 worker")
print(f"{'layout':8} {'policy':7} {'workers':>7} {'epoch s':>8} {'seeds/s':>10} {'speed-up':>8} {'workers/s':>10} "
      f"{'speed-up':>8} {'allreduce s':>11}  worker seeds/s")
for n in names:
    layout, policy, w = n.rsplit("-", 2)
    rows = runs[n]
    if rows is None:
        print(f"{layout:8} {policy:7} {w:>7} (failed: no metrics; see {out}/{n}.log)")
        continue
    rate = med(epoch_rate(r) for r in rows)
    workers_rate = med(sum(r.get("worker_seeds_per_s", [])) for r in rows)
    if w == "1":
        base[policy], base_workers[policy] = rate, workers_rate
    speed = rate / base[policy] if base.get(policy) else float("nan")
    workers_speed = workers_rate / base_workers[policy] if base_workers.get(policy) else float("nan")
    per = [med(r["worker_seeds_per_s"][k] for r in rows) for k in range(len(rows[-1].get("worker_seeds_per_s", [])))]
    print(f"{layout:8} {policy:7} {w:>7} {med(r['epoch_s'] for r in rows):8.3f} {rate:10.0f} {speed:7.2f}x "
          f"{workers_rate:10.0f} {workers_speed:7.2f}x {med(r.get('allreduce_s', 0) for r in rows):11.3f}  "
          f"{' '.join(f'{x:.0f}' for x in per)}")

stages = ["prepare", "host_features", "load", "io", "compute", "wait", "allreduce", "sum_wait", "vote_wait", "wall"]
print(f"\n== every worker's seconds per epoch by stage (median over epochs 2..)")
print(f"{'run':24} {'rank':>4} " + " ".join(f"{s:>13}" for s in stages))
for n in names:
    rows = runs[n]
    if rows is None or "worker_stage_s" not in rows[-1]:
        continue
    ranks = len(rows[-1]["worker_stage_s"]["wall"])
    for k in range(ranks):
        cells = []
        for s in stages:
            cells.append(f"{med(r['worker_stage_s'][s][k] for r in rows if s in r.get('worker_stage_s', {})):13.3f}")
        print(f"{n:24} {k:>4} " + " ".join(cells))
    cpus = rows[-1].get("worker_cpus")
    print(f"{'':24} threads: {rows[-1].get('worker_threads', '?')}" + (f"; {'; '.join(cpus)}" if cpus else ""))
PY
exit $failed
