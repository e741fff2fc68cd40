# tests/cli/expect_exit.sh — sourced by the tests of the bench scripts: `fail` counts a failure in
# $failures; `expect_exit CODE PATTERN ARGS...` runs `bash $script ARGS...` (environment given as
# prefix assignments, VAR=value expect_exit ...) and checks that it exits CODE and, for 2, prints
# one stderr line matching PATTERN (otherwise stdout matches it). Needs $script and $tmp set.
# shellcheck shell=bash disable=SC2154  # $script and $tmp come from the sourcing test
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

expect_exit() {
  local code=$1 pattern=$2 rc
  shift 2
  bash "$script" "$@" > "$tmp/stdout" 2> "$tmp/stderr"
  rc=$?
  [ "$rc" = "$code" ] || { fail "$* exited $rc, expected $code: $(cat "$tmp/stderr")"; return; }
  if [ "$code" = 2 ]; then
    [ "$(wc -l < "$tmp/stderr")" = 1 ] || fail "$*: expected one line on stderr, got: $(cat "$tmp/stderr")"
    grep -qE -- "$pattern" "$tmp/stderr" || fail "$*: stderr does not match '$pattern': $(cat "$tmp/stderr")"
  else
    grep -qE -- "$pattern" "$tmp/stdout" || fail "$*: stdout does not match '$pattern': $(cat "$tmp/stdout")"
  fi
}
