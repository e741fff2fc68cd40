#!/usr/bin/env bash
# The CPU configuration (GALE_WITH_CUDA=OFF) built with a sanitizer, then every test not labelled
# gpu run under it:
#   scripts/cpu-sanitizers.sh asan [BUILD]           AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/cpu-sanitizers.sh tsan TBB_DIR [BUILD]   ThreadSanitizer; TBB_DIR is the CMake package
#                                                    folder of a oneTBB built with TBB_SANITIZE=thread
# ThreadSanitizer cannot see the synchronisation inside an uninstrumented library, so against
# Debian's libtbb every hand-over between TBB's threads reads as a race: build oneTBB 2021.8 (the
# version of Debian's headers) from source first, e.g.
#   cmake -S oneTBB -B tbb-tsan -DTBB_SANITIZE=thread -DTBB_STRICT=OFF -DTBB_TEST=OFF \
#         -DTBBMALLOC_BUILD=OFF -DCMAKE_CXX_FLAGS=-Wno-tsan -DCMAKE_INSTALL_PREFIX=$PWD/tbb-inst
#   cmake --build tbb-tsan -j && cmake --install tbb-tsan      # TBB_DIR=$PWD/tbb-inst/lib/cmake/TBB
# OpenBLAS's threads and Open MPI's TCP transport are uninstrumented too: scripts/tsan.supp.
# Open MPI leaks at exit (its plugins, hwloc), so the Mpi tests run with LeakSanitizer off.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:?usage: cpu-sanitizers.sh asan|tsan [TBB_DIR] [BUILD]}
jobs=$(nproc)
case $kind in
asan)
  build=${2:-$here/build-asan}
  flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGALE_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
  cmake --build "$build" -j "$jobs"
  cd "$build"
  status=0
  UBSAN_OPTIONS=print_stacktrace=1 ctest -LE gpu -E '^Mpi\.' -j "$jobs" --output-on-failure || status=$?
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest -R '^Mpi\.' -j "$jobs" --output-on-failure || status=$?
  exit $status
  ;;
tsan)
  tbb_dir=${2:?usage: cpu-sanitizers.sh tsan TBB_DIR [BUILD]}
  build=${3:-$here/build-tsan}
  flags="-fsanitize=thread -fno-omit-frame-pointer"
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGALE_WITH_CUDA=OFF -DTBB_DIR="$tbb_dir" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
  cmake --build "$build" -j "$jobs"
  cd "$build"
  # The slow tests take hours under ThreadSanitizer; they add no threading the others lack.
  LD_LIBRARY_PATH="$(cd "$tbb_dir/../.." && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$here/scripts/tsan.supp" \
    ctest -LE 'gpu|slow' -j "$jobs" --output-on-failure
  ;;
*)
  echo "cpu-sanitizers.sh: expected asan or tsan, got '$kind'" >&2
  exit 2
  ;;
esac
