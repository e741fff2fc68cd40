#!/usr/bin/env bash
# Builds Gale for sm_90 and packs the binaries, test executables, the data the GPU tests read and
# the non-system shared libraries they need into one folder (default dist/gpu), so a machine with
# a GPU but without TBB / Boost / OpenBLAS packages can run them with LD_LIBRARY_PATH=dist/gpu/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist/gpu}
build=${BUILD:-build-gpu}
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGALE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$build" -j "$(nproc)"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
# The CLI and the GPU suites only (the CPU suites run in CI), stripped: the bundle travels.
cp "$build"/bin/gale "$build"/bin/gale_gpu_* "$build"/bin/gale_launchcost "$out/bin/"
strip "$out"/bin/*
cp -r tests/data "$out/data"
cp "$build"/lib/libgale_hostprof.so "$out/lib/"  # bench/hostprof: preloaded, never linked
# Libraries the GPU machine lacks: everything ldd resolves outside glibc, libstdc++ and CUDA. MPI
# stays out: its libraries must be the ones of the machine's own mpirun (Open MPI 4.1 there too,
# the same libmpi.so.40).
for f in "$out"/bin/*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*|libcuda*|libcudart*|libcublas*|libcusparse*|libnccl*|libnvJitLink*|libz.so*) ;;
    libmpi*|libopen-rte*|libopen-pal*|libhwloc*|libevent*|libpmix*|libudev*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
# What travels to the GPU machine is limited (64 MiB with the working tree): a gzipped tarball
# beside the folder is a fraction of it; unpack with `tar xzf DIST.tar.gz -C /tmp`.
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
du -sh "$out" "$out.tar.gz"
