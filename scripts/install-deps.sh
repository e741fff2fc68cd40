#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Gale builds against, when any is missing.
set -euo pipefail
pkgs=(cmake g++ make pkg-config libtbb-dev liburing-dev libboost-program-options-dev libspdlog-dev libfmt-dev
      nlohmann-json3-dev libxxhash-dev zlib1g-dev libopenblas-dev libmetis-dev libgtest-dev python3-numpy
      libopenmpi-dev openmpi-bin)
# `install-deps.sh fuzz`: clang and its libFuzzer runtime too (make fuzz, make fuzz-ci).
[ "${1:-}" = fuzz ] && pkgs+=(clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
