#!/usr/bin/env bash
# bench/multigpu_scaling.sh without a GPU: bad arguments exit 2 with one line naming what is wrong;
# MGS_DRY_RUN prints every run (each policy, one process and mpirun); and, given a gale binary
# and mpirun, a real run with CPU workers (MGS_CPU=1) on a small generated R-MAT prints the
# seeds-per-second table and every worker's stage seconds, and exits 0.
# usage: multigpu_scaling_test.sh path/to/bench/multigpu_scaling.sh [path/to/gale]
set -uo pipefail
script=$1 gale=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source-path=SCRIPTDIR source=expect_exit.sh
. "$(dirname "$0")/expect_exit.sh"
export OUT=$tmp/out

fake=$tmp/gale && printf '#!/bin/sh\nexit 0\n' > "$fake" && chmod +x "$fake"
expect_exit 2 'usage' "$fake"
expect_exit 2 'not an executable gale binary' "$tmp/none" "$tmp/store"
expect_exit 2 "unexpected 'x'" "$fake" "$tmp/store" x
MGS_GPUS="1 two" expect_exit 2 "MGS_GPUS: .*'two'" "$fake" "$tmp/store"
MGS_LAYOUTS=nodes expect_exit 2 "MGS_LAYOUTS: .*'nodes'" "$fake" "$tmp/store"
MGS_POLICIES=numa expect_exit 2 "MGS_POLICIES: .*'numa'" "$fake" "$tmp/store"
MGS_EPOCHS=1 expect_exit 2 "MGS_EPOCHS: .*'1'" "$fake" "$tmp/store"
mkdir -p "$tmp/notastore"
expect_exit 2 'is not a Gale store' "$fake" "$tmp/notastore"

# The dry run: every run's command, each policy, one process and mpirun, the store generated first.
MGS_DRY_RUN=1 MGS_CPU=1 MGS_GPUS="1 2" expect_exit 0 \
  'GALE_WORKER_THREADS=pinned .* train .*--fanouts 15,10,5 --batch-size 1024 --epochs 4 --eval none.*--workers 2 --prefetch 4$' \
  "$fake" "$tmp/store" -- --prefetch 4
MGS_DRY_RUN=1 MGS_CPU=1 MGS_GPUS="1 2" expect_exit 0 'GALE_WORKER_THREADS=shared .*--workers 1' "$fake" "$tmp/store"
if command -v mpirun > /dev/null; then
  MGS_DRY_RUN=1 MGS_CPU=1 MGS_GPUS="1 2" MGS_POLICIES=arenas expect_exit 0 'GALE_WORKER_THREADS=arenas mpirun -np 2 --bind-to none' \
    "$fake" "$tmp/store"
fi
MGS_DRY_RUN=1 MGS_CPU=1 MGS_GPUS="1 2" expect_exit 0 'preprocess --generate rmat:scale=23,' "$fake" "$tmp/store"
MGS_DRY_RUN=1 MGS_CPU=1 MGS_GPUS="1 2" MGS_LAYOUTS=launched expect_exit 0 'GALE_WORKER_THREADS=pinned .* train .*--device cpu --processes 2' \
  "$fake" "$tmp/store"
if command -v nvidia-smi > /dev/null; then
  MGS_DRY_RUN=1 MGS_GPUS="1 2" MGS_LAYOUTS=launched expect_exit 0 'CUDA_VISIBLE_DEVICES=0,1 .* train .*--gpus all --processes per-gpu' \
    "$fake" "$tmp/store"
fi

if [ -n "$gale" ] && command -v mpirun > /dev/null && command -v python3 > /dev/null; then
  MGS_CPU=1 MGS_GPUS="1 2" MGS_EPOCHS=2 MGS_SCALE=10 MGS_POLICIES="pinned shared" \
    expect_exit 0 'threads  pinned        2 .*x' "$gale" "$tmp/rmat.gale"
  grep -qE '^procs +shared +2 ' "$tmp/stdout" || fail "no procs row: $(cat "$tmp/stdout")"
  grep -qE '^launched +pinned +2 ' "$tmp/stdout" || fail "no launched row: $(cat "$tmp/stdout")"
  grep -qE '^threads-pinned-2 +1 ' "$tmp/stdout" || fail "no stage row of worker 1: $(cat "$tmp/stdout")"
  grep -qE "threads: arenas; cpu: cpus [0-9,-]+ \([0-9]+ threads\)" "$tmp/stdout" || fail "no worker cpus: $(cat "$tmp/stdout")"
else
  echo "skipped the CPU run (needs the gale binary, mpirun and python3)"
fi

[ "$failures" = 0 ] && echo "all passed"
[ "$failures" = 0 ]
