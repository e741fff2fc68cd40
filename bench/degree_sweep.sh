#!/usr/bin/env bash
# The aggregation and MaxK targets of issues 3 and 4 against mean degree, in one run on one GPU.
#
# usage: bench/degree_sweep.sh [--graphs 21:16,20:32,19:64,18:128] [--dims 64,128,256] [--k 32]
#                              [--work DIR]
#
# For each SCALE:EDGE_FACTOR it generates an R-MAT store (about the same number of entries for
# the defaults, mean degrees 30 to 191), then runs `gale bench spmm` (cuSPARSE and GAR at --dims),
# `gale bench spmm --maxk K --dims 256` and `gale bench train` for SAGE 3x256 with ReLU and with
# maxk:K (--tf32 --tune-gemm --stack-operands), and prints one row per graph: GAR's speedup over
# cuSPARSE at each width, the top-k's share of the SpGEMM, and the MaxK epoch's speedup over the
# ReLU epoch. Stores go to --work (default: a temporary folder, removed at the end).
# GALE=path/to/gale overrides the binary (default build/bin/gale).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gale=${GALE:-$here/../build/bin/gale}
graphs=21:16,20:32,19:64,18:128
dims=64,128,256
k=32
work=
while [ $# -gt 0 ]; do
  case $1 in
    --graphs|--dims|--k|--work) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      case $1 in --graphs) graphs=$2 ;; --dims) dims=$2 ;; --k) k=$2 ;; --work) work=$2 ;; esac
      shift 2 ;;
    *) echo "$0: unknown option '$1' (expected --graphs, --dims, --k or --work)" >&2; exit 2 ;;
  esac
done
[[ $graphs =~ ^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$ ]] || { echo "$0: --graphs: expected SCALE:EDGE_FACTOR[,...], got '$graphs'" >&2; exit 2; }
[[ $dims =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "$0: --dims: expected widths like 64,128,256, got '$dims'" >&2; exit 2; }
[[ $k =~ ^[0-9]+$ ]] || { echo "$0: --k: expected a whole number, got '$k'" >&2; exit 2; }
[ -x "$gale" ] || { echo "$0: $gale: no gale binary (build first, or set GALE)" >&2; exit 2; }
out=$(mktemp -d)
if [ -z "$work" ]; then work=$out/stores; fi
mkdir -p "$work"
trap 'rm -rf "$out"' EXIT
train=(--models sage --tf32 --tune-gemm --stack-operands --epochs 5 --warmup 2 --json)
for g in ${graphs//,/ }; do
  s=${g%:*} e=${g#*:}
  store=$work/rmat-$s-$e.gale
  "$gale" preprocess --generate "rmat:scale=$s,edge-factor=$e,classes=47,feature-dim=100" -o "$store" --force > /dev/null
  "$gale" bench spmm "$store" --dims "$dims" --kernels cusparse,gar --json > "$out/$g.spmm"
  "$gale" bench spmm "$store" --maxk "$k" --dims 256 --json > "$out/$g.maxk"
  "$gale" bench train "$store" "${train[@]}" --activation relu > "$out/$g.relu"
  "$gale" bench train "$store" "${train[@]}" --activation "maxk:$k" > "$out/$g.maxk-train"
done
python3 - "$out" "$graphs" "$k" <<'PY'
import json, sys
out, graphs, k = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
def rows(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
header = None
for g in graphs:
    spmm = [r for r in rows(f"{out}/{g}.spmm") if r.get("kernel") == "gar"]
    maxk = {r["kernel"]: r for r in rows(f"{out}/{g}.maxk") if r.get("k") == int(k)}
    relu, mk = rows(f"{out}/{g}.relu")[-1], rows(f"{out}/{g}.maxk-train")[-1]
    for r in (relu, mk):
        if "error" in r:
            sys.exit(f"degree_sweep.sh: graph {g}, {r['activation']} epoch: {r['error']} ({r.get('detail', '')})")
    if header is None:
        print(f"device: {spmm[0]['device']}")
        widths = " ".join(f"{'gar@' + str(r['width']):>8}" for r in spmm)
        header = f"{'graph':>7} {'rows':>9} {'entries':>10} {'degree':>6} {widths} {'topk/spgemm':>11} {'relu_ms':>8} {'maxk_ms':>8} {'maxk_x':>6}"
        print(header)
    n, e = spmm[0]["rows"], spmm[0]["nnz"]
    share = maxk["topk"]["median_ms"] / maxk["spgemm"]["median_ms"]
    ratios = " ".join(f"{r['speedup_vs_cusparse']:>7.2f}x" for r in spmm)
    print(f"{g:>7} {n:>9} {e:>10} {e / n:>6.1f} {ratios} {100 * share:>10.1f}% "
          f"{relu['ms_per_epoch']:>8.2f} {mk['ms_per_epoch']:>8.2f} {relu['ms_per_epoch'] / mk['ms_per_epoch']:>5.2f}x")
PY
