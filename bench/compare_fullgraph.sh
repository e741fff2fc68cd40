#!/usr/bin/env bash
# Gale vs PyG, full-graph training on the same store, side by side in one run on one GPU.
#
# usage: bench/compare_fullgraph.sh STORE [--models gcn,sage,gin] [--layers 3] [--hidden 256]
#                                   [--heads 4] [--epochs 5] [--warmup 2] [--norm none|batch]
#                                   [-- GALE_OPTIONS...]
#
# Runs `gale bench train STORE --json` and `bench/pyg_fullgraph.py STORE` with the same model
# options (PyG first, so Gale's run cannot warm its caches), then prints one row per model: ms per
# epoch and peak GPU GiB on each side, and the ratios. Options after `--` go to Gale only (e.g.
# --tf32, --spmm fused-gas). GALE=path/to/gale overrides the binary (default build/bin/gale),
# PYTHON the interpreter (default python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gale=${GALE:-$here/../build/bin/gale}
python=${PYTHON:-python3}
[ $# -ge 1 ] || { echo "usage: $0 STORE [--models M] [--layers L] [--hidden H] [--heads K] [--epochs E] [--warmup W] [--norm N] [-- GALE_OPTIONS]" >&2; exit 2; }
store=$1
shift
common=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    --models|--layers|--hidden|--heads|--epochs|--warmup|--norm) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      common+=("$1" "$2"); shift 2 ;;
    *) echo "$0: unknown option '$1' (Gale-only options go after --)" >&2; exit 2 ;;
  esac
done
[ -d "$store" ] || { echo "$0: $store: not a store directory" >&2; exit 2; }
[ -x "$gale" ] || { echo "$0: $gale: no gale binary (build first, or set GALE)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$python" "$here/pyg_fullgraph.py" "$store" "${common[@]}" > "$out/pyg.jsonl"
"$gale" bench train "$store" --json "${common[@]}" "$@" > "$out/gale.jsonl"
"$python" - "$out/gale.jsonl" "$out/pyg.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["model"]: r for r in map(json.loads, filter(str.strip, open(p)))}
gale, pyg = load(sys.argv[1]), load(sys.argv[2])
dev = next((r.get("device") for r in list(gale.values()) + list(pyg.values()) if r.get("device")), "?")
print(f"device: {dev}")
print(f"{'model':6} {'gale ms':>9} {'pyg ms':>9} {'speedup':>8} {'gale GiB':>9} {'pyg GiB':>8} {'mem ratio':>9}")
for m in gale:
    g, p = gale[m], pyg.get(m, {})
    gms, pms = g.get("ms_per_epoch"), p.get("ms_per_epoch")
    ggb, pgb = g.get("peak_gib"), p.get("peak_gib")
    fmt = lambda v, f: (f % v) if v is not None else "-"
    speed = fmt(pms / gms, "%.2fx") if gms and pms else ("pyg OOM" if p.get("error") else "-")
    ratio = fmt(ggb / pgb, "%.2f") if ggb and pgb else "-"
    print(f"{m:6} {fmt(gms, '%.1f'):>9} {fmt(pms, '%.1f') if pms else p.get('error', '-'):>9} {speed:>8} "
          f"{fmt(ggb, '%.2f'):>9} {fmt(pgb, '%.2f'):>8} {ratio:>9}")
PY
