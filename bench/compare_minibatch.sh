#!/usr/bin/env bash
# Gale vs plain PyTorch (GPU neighbour sampling + PyG SAGEConv), mini-batch SAGE training on the
# same store, side by side in one run on one GPU, in the same precision on both sides.
#
# usage: bench/compare_minibatch.sh STORE [--fanouts 15,10,5] [--batch-size 1024] [--hidden 256]
#                                   [--epochs 3] [--warmup 1] [--allow-mixed] [-- GALE_OPTIONS...]
#
# Runs bench/torch_minibatch.py STORE first (so Gale's run cannot warm its caches), then
# `gale train STORE --model sage --fanouts F --batch-size B --epochs WARMUP+EPOCHS --eval none
# --device cuda --metrics FILE`, with as many layers as fanouts and the anchor's optimiser settings
# (--lr 0.003 --dropout 0, unless given after --). The first WARMUP epochs of each side are not
# timed. Prints one row: each side's precision (fp32 or tf32), seconds per epoch on each side
# (median of the timed epochs), the speedup (torch / gale), Gale's sampling / compute / wait seconds
# and host-to-GPU GB per epoch (medians), and the peak GPU GiB on each side. Options after `--` go to
# Gale only (e.g. --feature-gpu-mem 4G), except that --tf32 there (or tf32 = true in Gale's --config
# file) also gives the torch side --tf32, so that both run their GEMMs on TF32 tensor cores; without
# it both run fp32.
#
# A mixed comparison is refused with one line on stderr and exit 3: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
# (PyTorch's GEMMs in TF32 behind allow_tf32) while Gale runs fp32, a TORCH_JSON of the other
# precision, or a torch row that reports another precision than Gale's. --allow-mixed prints it
# anyway, the row ending "mixed: gale X, torch Y". Exit 0 when the row is printed, 1 when a side
# fails, 2 for bad usage.
#
# GALE=path/to/gale overrides the binary (default build/bin/gale), PYTHON the interpreter (default
# python3), and TORCH_JSON=FILE takes the torch side's JSON line from FILE instead of running it (to
# test the table, or to reuse one torch run against several Gale runs of its precision).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=precision.sh
. "$here/precision.sh"
gale=${GALE:-$here/../build/bin/gale}
python=${PYTHON:-python3}
usage="usage: $0 STORE [--fanouts 15,10,5] [--batch-size B] [--hidden H] [--epochs E] [--warmup W] [--allow-mixed] [-- GALE_OPTIONS]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
store=$1
shift
fanouts=15,10,5 batch=1024 hidden=256 epochs=3 warmup=1 allow_mixed=0
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    --allow-mixed) allow_mixed=1; shift ;;
    --fanouts|--batch-size|--hidden|--epochs|--warmup) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      case $1 in
        --fanouts) [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "$0: --fanouts: expected positive integers such as 15,10,5, found '$2'" >&2; exit 2; }
          fanouts=$2 ;;
        --warmup) [[ $2 =~ ^[0-9]+$ ]] || { echo "$0: --warmup: expected 0 or more, found '$2'" >&2; exit 2; }
          warmup=$2 ;;
        *) [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$0: $1: expected a positive integer, found '$2'" >&2; exit 2; }
          case $1 in --batch-size) batch=$2 ;; --hidden) hidden=$2 ;; --epochs) epochs=$2 ;; esac ;;
      esac
      shift 2 ;;
    *) echo "$0: unknown option '$1' (Gale-only options go after --)" >&2; exit 2 ;;
  esac
done
[ -d "$store" ] || { echo "$0: $store: not a store directory" >&2; exit 2; }
[ -x "$gale" ] || { echo "$0: $gale: no gale binary (build first, or set GALE)" >&2; exit 2; }
[ -z "${TORCH_JSON:-}" ] || [ -f "$TORCH_JSON" ] || { echo "$0: TORCH_JSON=$TORCH_JSON: no such file" >&2; exit 2; }
layers=$(awk -F, '{print NF}' <<< "$fanouts")
# The anchor trains with Adam lr 0.003 and no dropout; Gale's defaults differ (0.01, 0.5).
anchor=()
[[ " $* " == *" --lr"[\ =]* ]] || anchor+=(--lr 0.003)
[[ " $* " == *" --dropout"[\ =]* ]] || anchor+=(--dropout 0)
# Both sides in Gale's precision; what cannot be matched is refused before anything runs.
gale_prec=$(gale_precision "$@")
torch_tf32=()
[ "$gale_prec" = fp32 ] || torch_tf32+=(--tf32)
if [ -n "${TORCH_JSON:-}" ]; then
  torch_prec=$(anchor_json_precision "$TORCH_JSON")
  [ "$torch_prec" = "$gale_prec" ] || [ "$allow_mixed" = 1 ] ||
    refuse_mixed "$0" "TORCH_JSON=$TORCH_JSON ran $torch_prec and Gale runs $gale_prec ($([ "$gale_prec" = tf32 ] && echo "--tf32 given" || echo "no --tf32"))"
elif [ "$gale_prec" = fp32 ] && [ "${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE:-}" = 1 ] && [ "$allow_mixed" = 0 ]; then
  refuse_mixed "$0" "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 puts torch's GEMMs in TF32 and Gale runs fp32 (no --tf32)"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -n "${TORCH_JSON:-}" ]; then
  cp "$TORCH_JSON" "$out/torch.json"
else
  "$python" "$here/torch_minibatch.py" "$store" --fanouts "$fanouts" --batch-size "$batch" --hidden "$hidden" \
    --layers "$layers" --epochs "$epochs" --warmup "$warmup" "${torch_tf32[@]}" > "$out/torch.json"
fi
if ! "$gale" train "$store" --model sage --layers "$layers" --hidden "$hidden" --fanouts "$fanouts" \
    --batch-size "$batch" --epochs $((warmup + epochs)) --eval none --device cuda --metrics "$out/gale.jsonl" \
    "${anchor[@]}" "$@" > "$out/gale.log" 2>&1; then
  echo "$0: gale train failed; the end of its output:" >&2
  tail -n 20 "$out/gale.log" >&2
  exit 1
fi
"$python" - "$out/gale.jsonl" "$out/torch.json" "$warmup" "$fanouts" "$batch" "$hidden" \
  "$gale_prec" "$allow_mixed" "$0" "$mixed_exit" <<'PY'
import json, statistics, sys
gale_path, torch_path, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
fanouts, batch, hidden = sys.argv[4], sys.argv[5], sys.argv[6]
gale_prec, allow_mixed, script, mixed_exit = sys.argv[7], sys.argv[8], sys.argv[9], int(sys.argv[10])
lines = [json.loads(l) for l in open(gale_path) if l.strip()]
epochs = [r for r in lines if not r.get("final")]
timed = epochs[warmup:]
if not timed:
    sys.exit(f"compare_minibatch: {gale_path}: {len(epochs)} epoch lines, none after {warmup} warmup")
rows = [json.loads(l) for l in open(torch_path) if l.strip()]
if not rows:
    sys.exit(f"compare_minibatch: {torch_path}: no JSON line from the torch side")
t = rows[-1]
# Rows from before the anchor took --tf32 ran fp32. Gale's metrics do not say: its options do.
torch_prec = t.get("precision", "fp32")
note = ""
if torch_prec != gale_prec:
    if allow_mixed != "1":
        flag = "--tf32 given" if gale_prec == "tf32" else "no --tf32"
        print(f"{script}: mixed precision: gale ran {gale_prec} ({flag}) and torch {torch_prec}; give both sides the "
              "same arithmetic, or pass --allow-mixed (before --) to print the rows marked as mixed", file=sys.stderr)
        sys.exit(mixed_exit)
    note = f"  mixed: gale {gale_prec}, torch {torch_prec}"
med = lambda key: statistics.median(r[key] for r in timed) if all(key in r for r in timed) else None
fmt = lambda v, f: (f % v) if v is not None else "-"
gs, ts = med("epoch_s"), t.get("s_per_epoch")
peaks = [r["gpu_peak_bytes"] for r in epochs if "gpu_peak_bytes" in r]
gale_gib = max(peaks) / 2**30 if peaks else None
h2d = med("host_to_gpu_bytes")
gb = timed[0].get("batches")
print(f"device: {t.get('device', '?')}")
print(f"sage {len(fanouts.split(','))}x{hidden}, fanouts {fanouts}, batch {batch}: {gb} batches per epoch, "
      f"{len(timed)} timed epochs after {warmup} warmup")
if t.get("batches") is not None and gb is not None and t["batches"] != gb:
    print(f"note: torch runs {t['batches']} batches per epoch, gale {gb}")
print(f"{'torch':>5} {'gale':>5} {'torch s/ep':>10} {'gale s/ep':>10} {'speedup':>8} {'sample s':>9} {'compute s':>9} {'wait s':>7} "
      f"{'H2D GB/ep':>9} {'torch GiB':>9} {'gale GiB':>9}")
speed = fmt(ts / gs, "%.2fx") if ts and gs else ("torch " + t["error"] if t.get("error") else "-")
print(f"{torch_prec:>5} {gale_prec:>5} {fmt(ts, '%.3f') if ts is not None else t.get('error', '-'):>10} {fmt(gs, '%.3f'):>10} {speed:>8} "
      f"{fmt(med('sample_s'), '%.3f'):>9} {fmt(med('compute_s'), '%.3f'):>9} {fmt(med('wait_s'), '%.3f'):>7} "
      f"{fmt(h2d / 1e9 if h2d is not None else None, '%.3f'):>9} {fmt(t.get('peak_gib'), '%.2f'):>9} "
      f"{fmt(gale_gib, '%.2f'):>9}{note}")
PY
