#!/usr/bin/env bash
# One device attempt for the MaxK kernels, run from a GPU bundle (scripts/gpu-bundle.sh) on the
# device machine: GPU tests first, then `gale bench spmm --maxk` on R-MAT scale 21 (edge factor
# 16) at width 256, the same bench for any tuning variants (BUNDLE/variants/NAME.gz, gale binaries
# built with other GALE_MAXK_* constants), an ncu profile of the MaxK kernels, SASS of the hot
# kernels, and compute-sanitizer memcheck/racecheck on small aggregation tests. Logs go to $OUT;
# the bench tables are printed last.
#   usage: bench/maxk/device_run.sh BUNDLE [KS]     (KS default 8,16,32)
set -u
bundle=$1
ks=${2:-8,16,32}
here=$(cd "$(dirname "$0")" && pwd)
cd "$bundle"
export LD_LIBRARY_PATH=$PWD/lib PATH=/usr/local/cuda/bin:$PATH
out=${OUT:-/tmp/maxk_out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$out/gpu.txt"
echo "== tests"
timeout 150 bin/gale_gpu_maxk_tests >"$out/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^\[  FAILED|^\[  PASSED|FAILED TEST" "$out/tests.log" | head -20
grep -B2 -A8 "Failure" "$out/tests.log" | head -60
echo "== store"
timeout 60 bin/gale preprocess --generate rmat:scale=21,edge-factor=16 -o /tmp/r.gale >/dev/null 2>&1; echo "store rc=$?"
echo "== bench"
timeout 120 bin/gale bench spmm /tmp/r.gale --maxk "$ks" --dims 256 >"$out/bench.txt" 2>&1; echo "bench rc=$?"
for v in variants/*.gz; do
  [ -e "$v" ] || continue
  name=$(basename "$v" .gz)
  gunzip -c "$v" >"/tmp/gale_$name" && chmod +x "/tmp/gale_$name"
  echo "-- variant $name" >>"$out/variants.txt"
  timeout 90 "/tmp/gale_$name" bench spmm /tmp/r.gale --maxk 16,32 --dims 256 2>&1 | grep -E "spgemm|sspmm|topk" >>"$out/variants.txt"
done
echo "== ncu"
timeout 150 ncu --clock-control none --csv --page raw -k "regex:maxk_forward|spgemm|sspmm" \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,lts__t_sectors_op_red.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
  bin/gale bench spmm /tmp/r.gale --maxk 16,32 --dims 256 --runs 1 --warmup 0 >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu rc=$?"
python3 "$here/ncu_summary.py" "$out/ncu.csv" >"$out/ncu_summary.txt" 2>&1
echo "== sass"
cuobjdump -sass bin/gale 2>/dev/null | awk '/Function :/{p = ($0 ~ /maxk_forward_kernelILi8Eh|spgemm_kernelILi16EhLb1|spgemm_kernelILi32EhLb1|sspmm_kernelIhLi4ELb1/)} p' >"$out/sass.txt"
for f in maxk_forward_kernelILi8Eh spgemm_kernelILi16EhLb1 spgemm_kernelILi32EhLb1 sspmm_kernelIhLi4ELb1; do
  awk -v f="$f" '/Function :/{p = ($0 ~ f)} p' "$out/sass.txt" >"$out/one.sass"
  echo "$f: $(grep -c 'LDL\|STL' "$out/one.sass") local ops; $(grep -c 'BRA.DIV' "$out/one.sass") BRA.DIV; LDG: $(grep -o 'LDG[.A-Z0-9]*' "$out/one.sass" | sort | uniq -c | tr '\n' ' ')"
done
rm -f "$out/one.sass"
echo "== sanitizer"
timeout 90 compute-sanitizer --tool memcheck bin/gale_gpu_maxk_tests --gtest_filter='*EveryDegree*:*SmallEmpty*:*TopKMatchesCpuExactly*' >"$out/memcheck.log" 2>&1; echo "memcheck rc=$? $(tail -1 "$out/memcheck.log")"
timeout 90 compute-sanitizer --tool racecheck bin/gale_gpu_maxk_tests --gtest_filter='*EveryDegree*:*Chained*' >"$out/racecheck.log" 2>&1; echo "racecheck rc=$? $(tail -1 "$out/racecheck.log")"
echo "== ncu summary"
cat "$out/ncu_summary.txt"
echo "== variants (k 16,32)"
cat "$out/variants.txt" 2>/dev/null
echo "== bench"
cat "$out/bench.txt"
