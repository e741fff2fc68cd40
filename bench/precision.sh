# shellcheck shell=bash
# What bench/compare_fullgraph.sh and bench/compare_minibatch.sh share about precision: which one
# Gale's options ask for, which one the anchor will run (or ran) in, and the one-line refusal of a
# comparison whose two sides do different arithmetic. Sourced, not run.
#
# A ratio between Gale and the anchor is a claim about the engines only when both do the same
# arithmetic: gale --tf32 rounds GEMM operands to TF32 while PyTorch's default (allow_tf32 False)
# keeps fp32, which alone is worth ~1.3x on the full-graph epoch.

# Exit code of a comparison refused for mixed precision (2 is bad usage, 1 a side that failed).
mixed_exit=3

# gale_option NAME ARGS...: the value Gale's options give --NAME (the last --NAME V or --NAME=V, else
# NAME = V in the INI file of --config), or nothing.
gale_option() {
  local name=$1 prev='' a value='' cfg=''
  shift
  for a in "$@"; do
    case $prev in --"$name") value=$a ;; --config) cfg=$a ;; esac
    case $a in --"$name"=*) value=${a#*=} ;; --config=*) cfg=${a#*=} ;; esac
    prev=$a
  done
  if [ -z "$value" ] && [ -n "$cfg" ] && [ -f "$cfg" ]; then
    value=$(sed -nE "s/^[[:space:]]*${name}[[:space:]]*=[[:space:]]*([^[:space:]#]*).*/\1/p" "$cfg" | tail -n 1)
  fi
  printf '%s' "$value"
}

# gale_precision ARGS...: "tf32" when Gale's options put its GEMMs on TF32 tensor cores (--tf32, or
# tf32 = true in a --config file), else "fp32".
gale_precision() {
  local a
  for a in "$@"; do [ "$a" = --tf32 ] && { echo tf32; return; }; done
  case $(gale_option tf32 "$@" | tr '[:upper:]' '[:lower:]') in
    true|1|yes|on) echo tf32 ;;
    *) echo fp32 ;;
  esac
}

# anchor_json_precision FILE: what a saved anchor's rows ran in. Rows without "precision" come from
# before the anchors took --tf32, when they always ran PyTorch's default, fp32.
anchor_json_precision() {
  if grep -qE '"precision": *"tf32"' "$1"; then echo tf32; else echo fp32; fi
}

# refuse_mixed SCRIPT WHAT: the one line that refuses a mixed comparison, and its exit code.
refuse_mixed() {
  echo "$1: mixed precision: $2; give both sides the same arithmetic, or pass --allow-mixed (before --) to print the rows marked as mixed" >&2
  exit "$mixed_exit"
}
