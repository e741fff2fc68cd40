#!/usr/bin/env bash
# Gale vs the memory-mapped PyTorch anchor when the host memory is smaller than the features:
# mini-batch SAGE on the same store, each side alone in a cgroup v2 capped at --limit.
#
# usage: bench/compare_outofcore.sh STORE --limit SIZE [--batches N] [--timeout SECONDS] [--dry-run]
#                                    [-- GALE_OPTIONS...]
#
# Runs, one after the other and each as the only process of its own cgroup
# (/sys/fs/cgroup/gale-ooc-NAME-PID, memory.max = SIZE, memory.swap.max = 0 where there is swap),
# with the page cache dropped before each (sync; echo 3 > /proc/sys/vm/drop_caches):
#   1. bench/torch_minibatch.py STORE --features mmap --batches N --warmup-batches 20 (sage, 3 layers
#      of 256, fanouts 15,10,5, batch 1024): features stay in an np.memmap of features.npy;
#   2. gale train STORE --model sage --layers 3 --hidden 256 --fanouts 15,10,5 --batch-size 1024
#      --eval none --device cuda --epochs E --metrics FILE --lr 0.003 --dropout 0 GALE_OPTIONS, where
#      E is one warmup epoch plus enough epochs for N batches (from the anchor's batches per epoch).
# A flag of Gale's given after -- replaces the script's own (--epochs, --lr, --dropout, ...); pass
# --host-mem-budget there to set Gale's host budget (Gale's default is derived from the cgroup).
# Prints per side: seconds per batch (the anchor's s_per_batch; Gale's timed epochs' epoch_s summed
# over their batches), bytes read from disk (the anchor's own /proc/self/io; Gale's
# /proc/PID/io read_bytes, sampled every 0.2 s while it runs, or the cgroup's io.stat where that is
# larger), the cgroup's memory.peak and OOM kills, and the exit code; then the speedup
# (anchor s/batch / Gale s/batch). A side still running after --timeout seconds (default 3600, 0:
# none) is killed and shows exit 124: under a tight limit mmap'd pages and even the program's own
# code are evicted and read again, and a run can thrash for hours instead of being OOM-killed.
# Exit 0 when both sides ran, 1 when one failed or timed out, 2 for bad usage.
#
# --dry-run checks the arguments and prints the commands without running them (no GPU, root or
# gale binary needed). GALE=path/to/gale overrides the binary (default build/bin/gale), PYTHON the
# interpreter (default python3), TORCH_JSON=FILE takes the anchor's JSON line from FILE instead of
# running it, CGROUP_ROOT the cgroup v2 mount (default /sys/fs/cgroup), and KEEP=DIR keeps each
# side's output, log and Gale's metrics in DIR (made if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gale=${GALE:-$here/../build/bin/gale}
python=${PYTHON:-python3}
cgroot=${CGROUP_ROOT:-/sys/fs/cgroup}
usage="usage: $0 STORE --limit SIZE [--batches N] [--timeout SECONDS] [--dry-run] [-- GALE_OPTIONS]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
case $1 in -*) echo "$0: expected the STORE first, found '$1'; $usage" >&2; exit 2 ;; esac
store=$1
shift
limit_text= batches=200 warmup_batches=20 timeout=3600 dry_run=0
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    --dry-run) dry_run=1; shift ;;
    --limit|--batches|--timeout) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      case $1 in
        --limit) limit_text=$2 ;;
        --batches) [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$0: --batches: expected a positive integer, found '$2'" >&2; exit 2; }
          batches=$2 ;;
        --timeout) [[ $2 =~ ^[0-9]+$ ]] || { echo "$0: --timeout: expected seconds (0: none), found '$2'" >&2; exit 2; }
          timeout=$2 ;;
      esac
      shift 2 ;;
    --limit=*|--batches=*|--timeout=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    *) echo "$0: unknown option '$1' (Gale-only options go after --)" >&2; exit 2 ;;
  esac
done
[ -n "$limit_text" ] || { echo "$0: --limit SIZE is required (the cgroup's memory.max, e.g. 8G)" >&2; exit 2; }
# 512M, 8G, 1.5G, 64GiB, 1048576: K, M, G, T are powers of 1024, as Gale's --gpu-mem-budget.
shopt -s nocasematch
[[ $limit_text =~ ^([0-9]+(\.[0-9]+)?)([KMGT]?)(I?B)?$ ]] ||
  { echo "$0: --limit: expected a size such as 512M or 16G, found '$limit_text'" >&2; exit 2; }
shopt -u nocasematch
limit=$(awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
  s = index("KMGT", toupper(u)); b = v * (s ? 1024 ^ s : 1); printf "%.0f", b }')
[ ${#limit} -le 18 ] || { echo "$0: --limit: $limit_text is larger than any host; expected a size such as 512M or 16G" >&2; exit 2; }
[ "$limit" -ge $((1 << 20)) ] ||
  { echo "$0: --limit: $limit_text is under 1 MiB; expected a size such as 512M or 16G" >&2; exit 2; }
[ -d "$store" ] && [ -f "$store/manifest.json" ] || { echo "$0: $store: not a store directory (no manifest.json)" >&2; exit 2; }
[ -z "${TORCH_JSON:-}" ] || [ -f "$TORCH_JSON" ] || { echo "$0: TORCH_JSON=$TORCH_JSON: no such file" >&2; exit 2; }

# Gale's flags: the script's defaults, each dropped when the user gives it after --.
user_flags=" $* "
gale_flags=()
add_default() {  # FLAG [VALUE]
  [[ $user_flags == *" $1 "* || $user_flags == *" $1="* ]] || gale_flags+=("$@")
}
add_default --model sage
add_default --layers 3
add_default --hidden 256
add_default --fanouts 15,10,5
add_default --batch-size 1024
add_default --eval none
add_default --device cuda
add_default --lr 0.003    # the anchor's Adam rate; Gale's default is 0.01
add_default --dropout 0   # the anchor has none; Gale's default is 0.5
anchor_cmd=("$python" "$here/torch_minibatch.py" "$store" --features mmap --batches "$batches"
            --warmup-batches "$warmup_batches" --fanouts 15,10,5 --batch-size 1024 --hidden 256 --layers 3)

# Gale's epochs: one warmup epoch, then enough for `batches` batches at the anchor's batches per
# epoch (both sides draw the same labelled training seeds with the same batch size).
gale_epochs() {  # ANCHOR_JSON -> E, or 2 when the anchor did not say
  "$python" - "$1" "$batches" <<'PY' 2>/dev/null || echo 2
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
per = rows[-1].get("batches") if rows else None
n = int(sys.argv[2])
print(1 + max(1, -(-n // per)) if per else 2)
PY
}

# show_in CGROUP CMD...: the command line run_capped uses, quoted for a shell.
show_in() {
  printf '%s' "sh -c 'echo \$\$ > \"\$0/cgroup.procs\" && exec \"\$@\"'"
  printf ' %q' "$@"
  echo
}
if [ $dry_run = 1 ]; then
  for side in torch gale; do
    cg=$cgroot/gale-ooc-$side-$$
    echo "# $side: limit $limit_text ($limit bytes)$([ "$timeout" = 0 ] || echo ", killed after ${timeout} s")"
    echo "mkdir $cg && echo $limit > $cg/memory.max && { [ ! -f $cg/memory.swap.max ] || echo 0 > $cg/memory.swap.max; }"
    echo "sync; echo 3 > /proc/sys/vm/drop_caches"
    if [ $side = torch ]; then
      if [ -n "${TORCH_JSON:-}" ]; then echo "# anchor: taken from TORCH_JSON=$TORCH_JSON"
      else show_in "$cg" "${anchor_cmd[@]}"; fi
    else
      epochs=EPOCHS
      [ -z "${TORCH_JSON:-}" ] || epochs=$(gale_epochs "$TORCH_JSON")
      [[ $user_flags == *" --epochs "* || $user_flags == *" --epochs="* ]] && e=() || e=(--epochs "$epochs")
      show_in "$cg" "$gale" train "$store" "${gale_flags[@]}" "${e[@]}" --metrics METRICS.jsonl "$@"
      [ "$epochs" != EPOCHS ] || [ ${#e[@]} = 0 ] || echo "# EPOCHS: 1 warmup + ceil($batches / the anchor's batches per epoch)"
    fi
  done
  exit 0
fi

# A writable cgroup v2 hierarchy with the memory controller, or nothing can be capped.
[ "$(stat -fc %T "$cgroot" 2>/dev/null)" = cgroup2fs ] ||
  { echo "$0: $cgroot is not a cgroup v2 mount: needs a writable cgroup v2 hierarchy (run as root on a cgroup v2 host, or set CGROUP_ROOT)" >&2; exit 2; }
[ -w "$cgroot" ] && [ -w "$cgroot/cgroup.subtree_control" ] ||
  { echo "$0: $cgroot: cgroup v2 not writable by $(id -un): needs root (or a delegated cgroup as CGROUP_ROOT)" >&2; exit 2; }
grep -qw memory "$cgroot/cgroup.subtree_control" || { echo +memory > "$cgroot/cgroup.subtree_control"; } 2>/dev/null ||
  { echo "$0: $cgroot: cannot enable the memory controller for child cgroups (cgroup.subtree_control)" >&2; exit 2; }
grep -qw io "$cgroot/cgroup.subtree_control" || { echo +io > "$cgroot/cgroup.subtree_control"; } 2>/dev/null || true
[ -x "$gale" ] || { echo "$0: $gale: no gale binary (build first, or set GALE)" >&2; exit 2; }

out=$(mktemp -d)
made=()   # cgroups to remove on the way out
child=    # the side running now, to stop if the script is
# stop_cgroup CG [PID]: kills everything in CG (cgroup.kill since Linux 5.14), else PID.
stop_cgroup() {
  # "return 0": a bare return in a function run from a trap gives the status before the trap.
  { echo 1 > "$1/cgroup.kill"; } 2>/dev/null && return 0
  [ -z "${2:-}" ] || kill -KILL "$2" 2>/dev/null || true
}
cleanup() {
  set +e  # remove every cgroup whatever fails on the way
  local cg i
  for cg in "${made[@]}"; do
    [ -n "$cg" ] || continue
    stop_cgroup "$cg" "$child"
    # A killed CUDA process can take seconds to release the GPU and leave the cgroup.
    [ -z "$child" ] || { wait "$child"; } 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
    [ ! -d "$cg" ] || echo "$0: could not remove $cg (still in use); rmdir it later" >&2
  done
  [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP" && cp -r "$out"/. "$KEEP"/; }
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_capped NAME STDOUT_FILE CMD...: runs CMD alone in a fresh cgroup; leaves NAME.rc, NAME.peak,
# NAME.ooms and NAME.read (disk bytes read) in $out.
run_capped() {
  local name=$1 stdout=$2 cg=$cgroot/gale-ooc-$1-$$ rc=0 bytes_read=0 now timed_out=0 start=$SECONDS
  shift 2
  mkdir "$cg" || { echo "$0: cannot create the cgroup $cg" >&2; exit 2; }
  made+=("$cg")
  echo "$limit" > "$cg/memory.max"
  [ ! -f "$cg/memory.swap.max" ] || echo 0 > "$cg/memory.swap.max"
  sync
  { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null || echo "$0: warning: page cache not dropped (/proc/sys/vm/drop_caches not writable)" >&2
  # The child moves itself into the cgroup before exec, so every byte the command maps is charged.
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" > "$stdout" 2> "$out/$name.log" &
  child=$!
  while kill -0 "$child" 2>/dev/null; do
    now=$(awk '/^read_bytes:/ {print $2}' "/proc/$child/io" 2>/dev/null || true)
    [ -z "$now" ] || bytes_read=$now
    if [ "$timeout" != 0 ] && [ $timed_out = 0 ] && [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "$0: $name still running after $timeout s (--timeout); killing it" >&2
      stop_cgroup "$cg" "$child"
      timed_out=1
    fi
    sleep 0.2
  done
  { wait "$child"; } 2>/dev/null || rc=$?  # no "Killed" job notice after a timeout
  [ $timed_out = 0 ] || rc=124
  child=
  # io.stat counts the whole cgroup, the reads of the last 0.2 s too, where the io controller is on.
  if [ -f "$cg/io.stat" ]; then
    now=$(awk '{for (i = 2; i <= NF; i++) if ($i ~ /^rbytes=/) {sub("rbytes=", "", $i); s += $i}} END {printf "%.0f", s}' "$cg/io.stat")
    [ "${now:-0}" -le "$bytes_read" ] || bytes_read=$now
  fi
  echo "$rc" > "$out/$name.rc"
  echo "$bytes_read" > "$out/$name.read"
  cat "$cg/memory.peak" > "$out/$name.peak" 2>/dev/null || echo - > "$out/$name.peak"
  awk '$1 == "oom_kill" {print $2}' "$cg/memory.events" > "$out/$name.ooms" 2>/dev/null || echo - > "$out/$name.ooms"
  rmdir "$cg" 2>/dev/null && made=("${made[@]/$cg}") || true
  if [ "$rc" != 0 ]; then
    echo "$0: $name exited with $rc; the end of its output:" >&2
    tail -n 10 "$out/$name.log" >&2
  fi
}

if [ -n "${TORCH_JSON:-}" ]; then
  cp "$TORCH_JSON" "$out/torch.json"
  echo 0 > "$out/torch.rc"; echo - > "$out/torch.read"; echo - > "$out/torch.peak"; echo - > "$out/torch.ooms"
else
  run_capped torch "$out/torch.json" "${anchor_cmd[@]}"
fi
epochs=()
[[ $user_flags == *" --epochs "* || $user_flags == *" --epochs="* ]] || epochs=(--epochs "$(gale_epochs "$out/torch.json")")
run_capped gale "$out/gale.out" "$gale" train "$store" "${gale_flags[@]}" "${epochs[@]}" --metrics "$out/gale.jsonl" "$@"

"$python" - "$out" "$limit_text" "$limit" <<'PY'
import json, os, sys
out, limit_text, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
def text(name):
    try:
        return open(os.path.join(out, name)).read().strip()
    except OSError:
        return "-"
def lines(name):
    try:
        return [json.loads(l) for l in open(os.path.join(out, name)) if l.strip().startswith("{")]
    except (OSError, ValueError):
        return []
t = (lines("torch.json") or [{}])[-1]
if not t.get("s_per_batch"):
    # Stopped before its JSON (a timeout): its rate from the last progress line on stderr, the timed
    # batches' when it reached them, else the warm-up's (which include the first, coldest batches).
    try:
        progress = [l.split() for l in open(os.path.join(out, "torch.log")) if l.startswith("progress ")]
    except OSError:
        progress = []
    timed = [p for p in progress if p[1] == "timed"]
    last = (timed or progress or [None])[-1]
    if last is not None:
        done, seconds = int(last[2]), float(last[3])
        t = dict(t, s_per_batch=seconds / done,
                 partial=f"stopped after {done} {last[1]} batches in {seconds:.1f} s; their rate")
epochs = [r for r in lines("gale.jsonl") if not r.get("final")]
timed = epochs[1:] if len(epochs) > 1 else epochs  # the first epoch warms caches and the allocator
gale_batches = sum(r.get("batches", 0) for r in timed)
gale_s = sum(r.get("epoch_s", 0) for r in timed) / gale_batches if gale_batches else None
torch_s = t.get("s_per_batch")
torch_read = t.get("disk_read_bytes") if t.get("disk_read_bytes") is not None else text("torch.read")
num = lambda v: int(v) if str(v).isdigit() else None
gb = lambda v: f"{num(v) / 1e9:.3f}" if num(v) is not None else "-"
gib = lambda v: f"{num(v) / 2**30:.2f}" if num(v) is not None else "-"
print(f"device: {t.get('device', '?')}; cgroup memory.max {limit_text} ({limit} bytes) per side, page cache dropped before each")
timed_read = t.get("timed_read_bytes")
print(f"torch: features mmap, {t.get('timed_batches', '?')} batches after {t.get('warmup_batches', '?')} warmup"
      + (f", {timed_read / 1e9:.3f} GB read from disk in the timed batches" if timed_read is not None else "")
      + (f" ({t['error']})" if t.get("error") else "")
      + (f" ({t['partial']})" if t.get("partial") else ""))
print(f"gale: {gale_batches} batches in {len(timed)} timed epochs after {len(epochs) - len(timed)} warmup")
print(f"{'side':<6} {'s/batch':>9} {'disk GB read':>12} {'peak GiB':>9} {'oom kills':>9} {'exit':>5}")
for name, s, read in (("torch", torch_s, torch_read), ("gale", gale_s, text("gale.read"))):
    print(f"{name:<6} {f'{s:.4f}' if s else '-':>9} {gb(read):>12} {gib(text(name + '.peak')):>9} "
          f"{text(name + '.ooms'):>9} {text(name + '.rc'):>5}")
if "124" in (text("torch.rc"), text("gale.rc")):
    print("exit 124: killed at --timeout")
print(f"speedup (torch s/batch / gale s/batch): {torch_s / gale_s:.2f}x"
      + (" (the anchor's rate before it was stopped)" if t.get("partial") else "") if torch_s and gale_s else "speedup: -")
PY
[ "$(cat "$out/torch.rc")" = 0 ] && [ "$(cat "$out/gale.rc")" = 0 ] || exit 1
