#!/usr/bin/env bash
# bench/compare_outofcore.sh's argument handling, with no GPU, root or gale binary: --dry-run prints
# the two capped commands and exits 0; bad arguments exit 2 with one line naming what is wrong.
# usage: compare_outofcore_test.sh path/to/bench/compare_outofcore.sh
set -uo pipefail
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/store" && echo '{}' > "$tmp/store/manifest.json"
# shellcheck source-path=SCRIPTDIR source=expect_exit.sh
. "$(dirname "$0")/expect_exit.sh"

store=$tmp/store
# --dry-run: both sides, capped at the limit in bytes, Gale's options after -- passed on.
expect_exit 0 'memory.max' "$store" --limit 8G --dry-run
expect_exit 0 'echo 8589934592 > .*gale-ooc-torch-' "$store" --limit 8G --dry-run
expect_exit 0 'echo 1610612736 > .*gale-ooc-gale-' "$store" --limit=1.5G --dry-run
expect_exit 0 'torch_minibatch.py .*--features mmap --batches 30 --warmup-batches 20' "$store" --limit 8G --batches 30 --dry-run
expect_exit 0 'gale train .*--model sage --layers 3 --hidden 256 --fanouts 15\\,10\\,5 --batch-size 1024 --eval none.* --host-mem-budget 6G$' \
  "$store" --limit 8G --dry-run -- --host-mem-budget 6G
expect_exit 0 'drop_caches' "$store" --limit 512M --dry-run
expect_exit 0 'killed after 3600 s' "$store" --limit 512M --dry-run
expect_exit 0 'killed after 60 s' "$store" --limit 512M --timeout 60 --dry-run
# A Gale flag after -- replaces the script's default instead of repeating it.
bash "$script" "$store" --limit 8G --dry-run -- --lr 0.01 --epochs 5 > "$tmp/stdout" 2>&1
grep -q -- '--lr 0.003' "$tmp/stdout" && fail "--lr after -- did not replace the default --lr 0.003"
[ "$(grep -o -- '--epochs [0-9A-Z]*' "$tmp/stdout")" = "--epochs 5" ] || fail "--epochs after -- did not replace the default"
grep -q -- '--host-mem-budget' "$tmp/stdout" && fail "--host-mem-budget passed without being asked for"
# With the anchor's JSON, Gale runs one warmup epoch plus enough for --batches: 1 + ceil(25 / 10).
if command -v python3 > /dev/null; then
  echo '{"model": "sage", "batches": 10, "s_per_batch": 0.1}' > "$tmp/torch.json"
  TORCH_JSON=$tmp/torch.json expect_exit 0 'gale train .*--epochs 4 ' "$store" --limit 8G --batches 25 --dry-run
fi

# Bad arguments: exit 2, one line naming the flag or the problem.
expect_exit 2 'usage'
expect_exit 2 '--limit SIZE is required' "$store" --dry-run
expect_exit 2 '--limit: .*found .8X.' "$store" --limit 8X --dry-run
expect_exit 2 '--limit: .*found .-1G.' "$store" --limit -1G --dry-run
expect_exit 2 '--limit: 0 is under 1 MiB' "$store" --limit 0 --dry-run
expect_exit 2 '--limit: .*larger than any host' "$store" --limit 99999999999999T --dry-run
expect_exit 2 '--limit needs a value' "$store" --limit
expect_exit 2 '--batches: expected a positive integer' "$store" --limit 8G --batches 0 --dry-run
expect_exit 2 '--batches: expected a positive integer' "$store" --limit 8G --batches x --dry-run
expect_exit 2 '--timeout: expected seconds' "$store" --limit 8G --timeout 1h --dry-run
expect_exit 2 "unknown option '--epochs'" "$store" --limit 8G --epochs 3 --dry-run
expect_exit 2 'not a store directory' "$tmp/missing" --limit 8G --dry-run
expect_exit 2 'expected the STORE first' --limit 8G "$store" --dry-run
TORCH_JSON=$tmp/none.json expect_exit 2 'TORCH_JSON=.*no such file' "$store" --limit 8G --dry-run
# Without --dry-run a cgroup v2 hierarchy is needed; a plain directory is not one.
CGROUP_ROOT=$tmp expect_exit 2 'not a cgroup v2 mount' "$store" --limit 8G

[ "$failures" = 0 ] || { echo "$failures failure(s)" >&2; exit 1; }
echo "compare_outofcore.sh: all argument checks passed"
