#!/usr/bin/env bash
# scripts/compare-bench-runs.sh on the CPU: a binary against itself is "same" in every case (exit 0);
# against a wrapper that changes one field that is not a time ("nodes" in bench sample's row), that
# case says DIFFERENT and the script exits 1; a bad device exits 2.
# usage: compare_runs_test.sh SCRIPT GALE
set -uo pipefail
script=$1 gale=$2
command -v python3 >/dev/null || { echo "compare_runs_test: skipped: no python3"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "compare_runs_test: $*"; exit 1; }

out=$("$script" "$gale" "$gale" "$tmp/w" cpu) || fail "a binary against itself exited $?: $out"
[ "$(grep -c ' same' <<< "$out")" = 6 ] || fail "expected 6 cases the same: $out"

cat > "$tmp/changed" <<SH
#!/usr/bin/env bash
# gale, with bench sample's node count off by one
"$gale" "\$@" | sed 's/"nodes":4096/"nodes":4095/'
exit \${PIPESTATUS[0]}
SH
chmod +x "$tmp/changed"
out=$("$script" "$gale" "$tmp/changed" "$tmp/w" cpu); rc=$?
[ $rc = 1 ] || fail "a changed field: expected exit 1, got $rc: $out"
grep -q '^sample .*DIFFERENT.*nodes' <<< "$out" || fail "the sample case should name 'nodes': $out"
[ "$(grep -c ' same' <<< "$out")" = 5 ] || fail "the other 5 cases should stay the same: $out"

"$script" "$gale" "$gale" "$tmp/w" tpu >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "a bad device: expected exit 2, got $rc"
echo "compare_runs_test: ok"
