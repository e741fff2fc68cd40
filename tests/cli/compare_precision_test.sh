#!/usr/bin/env bash
# bench/compare_fullgraph.sh and bench/compare_minibatch.sh compare like with like, with no GPU,
# torch or gale binary: a fake gale (GALE=) and a fake interpreter (PYTHON=) that records the
# anchor's command line and prints the rows a real anchor would, while the scripts' tables run in
# the real python3. Asserts that --tf32 for Gale reaches the anchor, that each row names both
# sides' precision, that a mixed comparison exits 3 with one line naming the flag, and that
# --allow-mixed prints it marked as mixed.
# usage: compare_precision_test.sh path/to/bench
set -uo pipefail
bench=$1
real_python=$(command -v python3) || { echo "compare_precision_test: skipped: no python3 for the scripts' tables"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/store" && echo '{}' > "$tmp/store/manifest.json"
store=$tmp/store
export FAKE_LOG=$tmp/commands.log
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# gale: logs its command line; `bench train` prints a JSON row per model ("tf32" and "spmm" as the
# real one reports them, tf32 also from `tf32 = true` in a --config file), `train` writes one
# metrics line per epoch.
cat > "$tmp/gale" <<'SH'
#!/usr/bin/env bash
echo "gale $*" >> "$FAKE_LOG"
tf32=false spmm=auto models=gcn,sage,gin metrics= epochs=1 prev=
for a in "$@"; do
  case $prev in --models) models=$a ;; --spmm) spmm=$a ;; --metrics) metrics=$a ;; --epochs) epochs=$a ;;
    --config) grep -q '^tf32 = true$' "$a" && tf32=true ;; esac
  [ "$a" = --tf32 ] && tf32=true
  prev=$a
done
if [ "$1 $2" = "bench train" ]; then
  for m in ${models//,/ }; do
    echo "{\"side\": \"gale\", \"model\": \"$m\", \"device\": \"Fake GPU\", \"spmm\": \"$spmm\", \"tf32\": $tf32, \"ms_per_epoch\": 50.0, \"peak_gib\": 1.0}"
  done
elif [ "$1" = train ]; then
  for ((e = 0; e < epochs; e++)); do
    echo "{\"epoch\": $e, \"epoch_s\": 2.0, \"sample_s\": 0.5, \"compute_s\": 1.0, \"wait_s\": 0.1, \"batches\": 10, \"host_to_gpu_bytes\": 1000000000, \"gpu_peak_bytes\": 1073741824}" >> "$metrics"
  done
fi
SH
# python: `python - ARGS` (a script's table) is the real interpreter; an anchor script logs its
# command line and prints its rows, in TF32 when given --tf32 or forced by the environment, unless
# FAKE_ANCHOR_PRECISION overrides what it reports (an anchor that ignored the flag).
cat > "$tmp/python" <<SH
#!/usr/bin/env bash
[ "\$1" = - ] && exec "$real_python" "\$@"
SH
cat >> "$tmp/python" <<'SH'
echo "anchor $*" >> "$FAKE_LOG"
prec=fp32 models=gcn,sage,gin prev=
for a in "$@"; do
  [ "$a" = --tf32 ] && prec=tf32
  [ "$prev" = --models ] && models=$a
  prev=$a
done
[ "${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE:-}" = 1 ] && prec=tf32
prec=${FAKE_ANCHOR_PRECISION:-$prec}
case $(basename "$1") in
  pyg_fullgraph.py)
    for m in ${models//,/ }; do
      echo "{\"side\": \"pyg\", \"model\": \"$m\", \"device\": \"Fake GPU\", \"precision\": \"$prec\", \"ms_per_epoch\": 150.0, \"peak_gib\": 2.0}"
    done ;;
  torch_minibatch.py)
    echo "{\"model\": \"sage\", \"device\": \"Fake GPU\", \"features\": \"gpu\", \"precision\": \"$prec\", \"s_per_epoch\": 4.0, \"batches\": 10, \"peak_gib\": 2.0}" ;;
  *) echo "fake python: unexpected script $1" >&2; exit 1 ;;
esac
SH
chmod +x "$tmp/gale" "$tmp/python"
export GALE=$tmp/gale PYTHON=$tmp/python
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE PYG_JSON TORCH_JSON FAKE_ANCHOR_PRECISION

# expect CODE PATTERN SCRIPT ARGS...: SCRIPT exits CODE; for 0 its stdout matches PATTERN, otherwise
# its stderr is one line matching PATTERN. The commands it ran are left in $FAKE_LOG.
expect() {
  local code=$1 pattern=$2 script=$3 rc
  shift 3
  : > "$FAKE_LOG"
  bash "$bench/$script" "$@" > "$tmp/stdout" 2> "$tmp/stderr"
  rc=$?
  [ "$rc" = "$code" ] || { fail "$script $* exited $rc, expected $code: $(cat "$tmp/stderr")"; return; }
  if [ "$code" = 0 ]; then
    grep -qE -- "$pattern" "$tmp/stdout" || fail "$script $*: stdout does not match '$pattern': $(cat "$tmp/stdout")"
  else
    [ "$(wc -l < "$tmp/stderr")" = 1 ] || fail "$script $*: expected one line on stderr, got: $(cat "$tmp/stderr")"
    grep -qE -- "$pattern" "$tmp/stderr" || fail "$script $*: stderr does not match '$pattern': $(cat "$tmp/stderr")"
  fi
}
# ran PATTERN WHAT: the last expect's commands include one matching PATTERN (or, with !, none).
ran() {
  if [ "$1" = '!' ]; then
    grep -qE -- "$2" "$FAKE_LOG" && fail "$3: ran '$(grep -E -- "$2" "$FAKE_LOG")'"
  else
    grep -qE -- "$1" "$FAKE_LOG" || fail "$2: no command matches '$1' in: $(cat "$FAKE_LOG")"
  fi
}
rows() { grep -cE -- "$1" "$tmp/stdout"; }

full=compare_fullgraph.sh
# fp32 on both sides by default: the anchor gets no --tf32, and each row says fp32 twice.
expect 0 '^gcn +fp32 +fp32 +50\.0 +150\.0 +3\.00x' $full "$store" --models gcn,sage
ran '!' 'anchor .*--tf32' "$full without --tf32"
[ "$(rows '^(gcn|sage) +fp32 +fp32 ')" = 2 ] || fail "$full: expected two fp32/fp32 rows: $(cat "$tmp/stdout")"
grep -q mixed "$tmp/stdout" && fail "$full: an equal comparison marked as mixed: $(cat "$tmp/stdout")"
# Gale's --tf32 reaches the anchor's command line; the rows say tf32 on both sides.
expect 0 '^gcn +tf32 +tf32 ' $full "$store" --models gcn,sage,gin --layers 2 -- --tf32 --spmm fused-gas
ran 'anchor .*pyg_fullgraph\.py .*--models gcn,sage,gin --layers 2 --tf32' "$full -- --tf32"
ran 'gale bench train .*--json .*--tf32 --spmm fused-gas' "$full -- --tf32"
[ "$(rows '^(gcn|sage|gin) +tf32 +tf32 ')" = 3 ] || fail "$full -- --tf32: expected three tf32/tf32 rows: $(cat "$tmp/stdout")"
# tf32 = true in Gale's --config counts as --tf32.
printf 'epochs = 3\ntf32 = true\n' > "$tmp/gale.ini"
expect 0 '^gcn +tf32 +tf32 ' $full "$store" --models gcn -- --config "$tmp/gale.ini"
ran 'anchor .*--tf32' "$full -- --config (tf32 = true)"
# --tune-gemm changes how the GEMMs are computed, not their precision: still fp32 on both sides.
expect 0 '^gcn +fp32 +fp32 ' $full "$store" --models gcn -- --tune-gemm

# --spmm tc: a TF32 SpMM PyG cannot match, refused before anything runs; --allow-mixed says so.
expect 3 'mixed precision: --spmm tc' $full "$store" --models gcn -- --spmm tc
ran '!' '.' "$full -- --spmm tc (refused)"
expect 3 'mixed precision: --spmm tc' $full "$store" --models gcn -- --tf32 --spmm=tc
expect 0 '^gcn +fp32 +fp32 .*mixed: gale fp32 with a TF32 SpMM \(--spmm tc\), pyg fp32$' $full "$store" --models gcn --allow-mixed -- --spmm tc
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces the anchor into TF32: refused unless Gale is TF32 too.
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 expect 3 'TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 .*no --tf32.*--allow-mixed' $full "$store" --models gcn
ran '!' '.' "$full with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (refused)"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 expect 0 '^gcn +tf32 +tf32 ' $full "$store" --models gcn -- --tf32
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 expect 0 '^gcn +fp32 +tf32 .*mixed: gale fp32, pyg tf32$' $full "$store" --models gcn --allow-mixed
# Rows are checked too: an anchor that reports fp32 after being given --tf32 is refused after the run.
FAKE_ANCHOR_PRECISION=fp32 expect 3 'mixed precision: gcn: gale ran tf32 \(--tf32 given\) and pyg fp32' $full "$store" --models gcn -- --tf32
FAKE_ANCHOR_PRECISION=fp32 expect 0 '^gcn +tf32 +fp32 .*mixed: gale tf32, pyg fp32$' $full "$store" --models gcn --allow-mixed -- --tf32
# PYG_JSON: saved anchor rows stand in for a run, and must be of Gale's precision.
echo '{"side": "pyg", "model": "gcn", "device": "Fake GPU", "precision": "tf32", "ms_per_epoch": 120.0, "peak_gib": 2.0}' > "$tmp/pyg_tf32.jsonl"
echo '{"side": "pyg", "model": "gcn", "device": "Fake GPU", "ms_per_epoch": 150.0, "peak_gib": 2.0}' > "$tmp/pyg_old.jsonl"
PYG_JSON=$tmp/pyg_tf32.jsonl expect 0 '^gcn +tf32 +tf32 +50\.0 +120\.0 +2\.40x' $full "$store" --models gcn -- --tf32
ran '!' 'anchor ' "$full with PYG_JSON"
PYG_JSON=$tmp/pyg_tf32.jsonl expect 3 'PYG_JSON=.*ran tf32 and Gale runs fp32 \(no --tf32\)' $full "$store" --models gcn
PYG_JSON=$tmp/pyg_tf32.jsonl expect 0 '^gcn +fp32 +tf32 .*mixed: gale fp32, pyg tf32$' $full "$store" --models gcn --allow-mixed
# Rows saved before the anchor took --tf32 ran fp32.
PYG_JSON=$tmp/pyg_old.jsonl expect 0 '^gcn +fp32 +fp32 ' $full "$store" --models gcn
PYG_JSON=$tmp/pyg_old.jsonl expect 3 'PYG_JSON=.*ran fp32 and Gale runs tf32 \(--tf32 given\)' $full "$store" --models gcn -- --tf32
PYG_JSON=$tmp/none.jsonl expect 2 'PYG_JSON=.*no such file' $full "$store"
# Usage still checked, and names --allow-mixed.
expect 2 'usage: .*--allow-mixed' $full
expect 2 "unknown option '--tf32' \(Gale-only options go after --\)" $full "$store" --tf32

mini=compare_minibatch.sh
expect 0 '^ fp32  fp32 +4\.000 +2\.000 +2\.00x' $mini "$store"
ran 'anchor .*torch_minibatch\.py .*--fanouts 15,10,5 .*--warmup 1$' "$mini without --tf32"
ran 'gale train .*--epochs 4 .*--lr 0\.003 --dropout 0$' "$mini without --tf32"
grep -q mixed "$tmp/stdout" && fail "$mini: an equal comparison marked as mixed: $(cat "$tmp/stdout")"
expect 0 '^ tf32  tf32 +4\.000 +2\.000 +2\.00x' $mini "$store" --fanouts 10,5 -- --tf32
ran 'anchor .*torch_minibatch\.py .*--fanouts 10,5 .*--layers 2 .*--tf32$' "$mini -- --tf32"
ran 'gale train .*--layers 2 .*--tf32$' "$mini -- --tf32"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 expect 3 'TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 .*no --tf32' $mini "$store"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 expect 0 '^ tf32  fp32 .*mixed: gale fp32, torch tf32$' $mini "$store" --allow-mixed
FAKE_ANCHOR_PRECISION=fp32 expect 3 'mixed precision: gale ran tf32 \(--tf32 given\) and torch fp32' $mini "$store" -- --tf32
echo '{"model": "sage", "device": "Fake GPU", "precision": "tf32", "s_per_epoch": 3.0, "batches": 10, "peak_gib": 2.0}' > "$tmp/torch_tf32.json"
echo '{"model": "sage", "device": "Fake GPU", "s_per_epoch": 4.0, "batches": 10, "peak_gib": 2.0}' > "$tmp/torch_old.json"
TORCH_JSON=$tmp/torch_tf32.json expect 0 '^ tf32  tf32 +3\.000 +2\.000 +1\.50x' $mini "$store" -- --tf32
ran '!' 'anchor ' "$mini with TORCH_JSON"
TORCH_JSON=$tmp/torch_tf32.json expect 3 'TORCH_JSON=.*ran tf32 and Gale runs fp32 \(no --tf32\)' $mini "$store"
ran '!' '.' "$mini with a TORCH_JSON of the other precision (refused)"
TORCH_JSON=$tmp/torch_tf32.json expect 0 '^ tf32  fp32 .*mixed: gale fp32, torch tf32$' $mini "$store" --allow-mixed
TORCH_JSON=$tmp/torch_old.json expect 3 'TORCH_JSON=.*ran fp32 and Gale runs tf32 \(--tf32 given\)' $mini "$store" -- --tf32
TORCH_JSON=$tmp/torch_old.json expect 0 '^ fp32  fp32 ' $mini "$store"
expect 2 'usage: .*--allow-mixed' $mini

[ "$failures" = 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "compare_fullgraph.sh, compare_minibatch.sh: precision checks passed"
