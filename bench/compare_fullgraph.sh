#!/usr/bin/env bash
# Gale vs PyG, full-graph training on the same store, side by side in one run on one GPU, in the
# same precision on both sides.
#
# usage: bench/compare_fullgraph.sh STORE [--models gcn,sage,gin] [--layers 3] [--hidden 256]
#                                   [--heads 4] [--epochs 5] [--warmup 2] [--norm none|batch]
#                                   [--allow-mixed] [-- GALE_OPTIONS...]
#
# Runs `gale bench train STORE --json` and `bench/pyg_fullgraph.py STORE` with the same model
# options (PyG first, so Gale's run cannot warm its caches), then prints one row per model: each
# side's precision (fp32 or tf32), ms per epoch and peak GPU GiB on each side, and the ratios.
# Options after `--` go to Gale only (e.g. --spmm fused-gas, --tune-gemm), except that --tf32 there
# (or tf32 = true in Gale's --config file) also gives the PyG side --tf32, so that both run their
# GEMMs on TF32 tensor cores; without it both run fp32.
#
# A mixed comparison is refused with one line on stderr and exit 3: Gale's --spmm tc (its SpMM in
# TF32, where PyG's cuSPARSE SpMM has no TF32 path), TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (PyTorch's
# GEMMs in TF32 behind allow_tf32) while Gale runs fp32, a PYG_JSON of the other precision, or rows
# that report different precisions. --allow-mixed prints it anyway, each row ending
# "mixed: gale X, pyg Y". Exit 0 when the table is printed, 1 when a side fails, 2 for bad usage.
#
# GALE=path/to/gale overrides the binary (default build/bin/gale), PYTHON the interpreter (default
# python3), and PYG_JSON=FILE takes the PyG side's rows from FILE (a saved output of
# pyg_fullgraph.py) instead of running it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=precision.sh
. "$here/precision.sh"
gale=${GALE:-$here/../build/bin/gale}
python=${PYTHON:-python3}
usage="usage: $0 STORE [--models M] [--layers L] [--hidden H] [--heads K] [--epochs E] [--warmup W] [--norm N] [--allow-mixed] [-- GALE_OPTIONS]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
store=$1
shift
common=()
allow_mixed=0
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    --allow-mixed) allow_mixed=1; shift ;;
    --models|--layers|--hidden|--heads|--epochs|--warmup|--norm) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      common+=("$1" "$2"); shift 2 ;;
    *) echo "$0: unknown option '$1' (Gale-only options go after --)" >&2; exit 2 ;;
  esac
done
[ -d "$store" ] || { echo "$0: $store: not a store directory" >&2; exit 2; }
[ -x "$gale" ] || { echo "$0: $gale: no gale binary (build first, or set GALE)" >&2; exit 2; }
[ -z "${PYG_JSON:-}" ] || [ -f "$PYG_JSON" ] || { echo "$0: PYG_JSON=$PYG_JSON: no such file" >&2; exit 2; }

# Both sides in Gale's precision; what cannot be matched is refused before anything runs.
gale_prec=$(gale_precision "$@")
anchor=()
[ "$gale_prec" = fp32 ] || anchor+=(--tf32)
spmm_tc=0
if [ "$(gale_option spmm "$@")" = tc ]; then
  spmm_tc=1
  [ "$allow_mixed" = 1 ] || refuse_mixed "$0" "--spmm tc aggregates in TF32 on Gale's side and PyG's SpMM has no TF32 path"
fi
if [ -n "${PYG_JSON:-}" ]; then
  pyg_prec=$(anchor_json_precision "$PYG_JSON")
  [ "$pyg_prec" = "$gale_prec" ] || [ "$allow_mixed" = 1 ] ||
    refuse_mixed "$0" "PYG_JSON=$PYG_JSON ran $pyg_prec and Gale runs $gale_prec ($([ "$gale_prec" = tf32 ] && echo "--tf32 given" || echo "no --tf32"))"
elif [ "$gale_prec" = fp32 ] && [ "${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE:-}" = 1 ] && [ "$allow_mixed" = 0 ]; then
  refuse_mixed "$0" "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 puts PyG's GEMMs in TF32 and Gale runs fp32 (no --tf32)"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -n "${PYG_JSON:-}" ]; then
  cp "$PYG_JSON" "$out/pyg.jsonl"
else
  "$python" "$here/pyg_fullgraph.py" "$store" "${common[@]}" "${anchor[@]}" > "$out/pyg.jsonl"
fi
"$gale" bench train "$store" --json "${common[@]}" "$@" > "$out/gale.jsonl"
"$python" - "$out/gale.jsonl" "$out/pyg.jsonl" "$gale_prec" "$allow_mixed" "$spmm_tc" "$0" "$mixed_exit" <<'PY'
import json, sys
gale_path, pyg_path, gale_prec, allow_mixed, spmm_tc, script, mixed_exit = sys.argv[1:8]
def load(p):
    return {r["model"]: r for r in map(json.loads, filter(str.strip, open(p)))}
gale, pyg = load(gale_path), load(pyg_path)
# Each side's precision as its rows report it: Gale's "tf32" key, the anchor's "precision" (rows
# from before the anchors took --tf32 ran fp32); None for a model the anchor has no row for.
def precisions(m):
    g, p = gale[m], pyg.get(m)
    gp = ("tf32" if g["tf32"] else "fp32") if "tf32" in g else gale_prec
    return gp, p.get("precision", "fp32") if p else None
notes = {}
for m in gale:
    gp, pp = precisions(m)
    if spmm_tc == "1" or (pp is not None and gp != pp):
        notes[m] = f"mixed: gale {gp}{' with a TF32 SpMM (--spmm tc)' if spmm_tc == '1' else ''}, pyg {pp or '-'}"
        if allow_mixed != "1" and pp is not None and gp != pp:
            flag = "--tf32 given" if gp == "tf32" else "no --tf32"
            print(f"{script}: mixed precision: {m}: gale ran {gp} ({flag}) and pyg {pp}; give both sides the same "
                  "arithmetic, or pass --allow-mixed (before --) to print the rows marked as mixed", file=sys.stderr)
            sys.exit(int(mixed_exit))
dev = next((r.get("device") for r in list(gale.values()) + list(pyg.values()) if r.get("device")), "?")
print(f"device: {dev}")
print(f"{'model':6} {'gale':>5} {'pyg':>5} {'gale ms':>9} {'pyg ms':>9} {'speedup':>8} {'gale GiB':>9} {'pyg GiB':>8} "
      f"{'mem ratio':>9}")
for m in gale:
    g, p = gale[m], pyg.get(m, {})
    gp, pp = precisions(m)
    gms, pms = g.get("ms_per_epoch"), p.get("ms_per_epoch")
    ggb, pgb = g.get("peak_gib"), p.get("peak_gib")
    fmt = lambda v, f: (f % v) if v is not None else "-"
    speed = fmt(pms / gms, "%.2fx") if gms and pms else ("pyg OOM" if p.get("error") else "-")
    ratio = fmt(ggb / pgb, "%.2f") if ggb and pgb else "-"
    row = (f"{m:6} {gp:>5} {pp or '-':>5} {fmt(gms, '%.1f'):>9} {fmt(pms, '%.1f') if pms else p.get('error', '-'):>9} "
           f"{speed:>8} {fmt(ggb, '%.2f'):>9} {fmt(pgb, '%.2f'):>8} {ratio:>9}")
    print(row + ("  " + notes[m] if m in notes else ""))
PY
