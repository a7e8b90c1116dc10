#!/usr/bin/env bash
# A named fake of nccl-tests' `<collective>_perf` binaries, for a machine without GPUs: installed under each binary's
# name, it prints what the real one prints (banner, one `#  Rank` line per GPU, the table in nccl-tests' columns with
# out-of-place and in-place halves, `# Avg bus bandwidth`) for the sizes asked (-b .. -e, doubling), with a bus
# bandwidth rising to FAKE_PEAK_BUSBW_GBPS (default 380) for large messages. Only the numbers are made up. With
# FAKE_NCCL_FAILURE set it dies as a binary whose peer went away does (NCCL's WARN line, then exit 1).
set -euo pipefail
if [ -n "${FAKE_NCCL_FAILURE:-}" ]; then
  echo "$(hostname):$$:$$ [0] misc/socket.cc:484 NCCL WARN Net : Connection closed by remote peer 10.0.0.2<50362>"
  echo "$(hostname): Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details)'"
  exit 1
fi
name=$(basename "$0")
op=${name%_perf}
gpus=1 min=8 max=1048576 iters=20 warmup=5
while [ $# -gt 0 ]; do
  case $1 in
    -g) gpus=$2; shift ;;
    -b) min=$2; shift ;;
    -e) max=$2; shift ;;
    -n) iters=$2; shift ;;
    -w) warmup=$2; shift ;;
  esac
  shift
done
echo "# nThread 1 nGpus $gpus minBytes $min maxBytes $max step: 2(factor) warmup iters: $warmup iters: $iters agg iters: 1 validation: 1 graph: 0"
echo "#"
echo "# Using devices"
for ((r = 0; r < gpus; r++)); do
  printf "#  Rank %2d Group  0 Pid %6d on %10s device %2d [0x%02x] NVIDIA H100 80GB HBM3\n" "$r" "$$" "$(hostname)" "$r" $((24 + r))
done
echo "#"
echo "#                                                              out-of-place                       in-place          "
echo "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
echo "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "
awk -v op="$op" -v n="$gpus" -v min="$min" -v max="$max" -v peak="${FAKE_PEAK_BUSBW_GBPS:-380}" 'BEGIN {
  factor = (op == "all_reduce") ? 2 * (n - 1) / n : ((op == "sendrecv") ? 1 : (n - 1) / n)
  redop = (op ~ /reduce/) ? "sum" : "none"
  total = 0; rows = 0
  for (size = min; size <= max; size *= 2) {
    busbw = peak * size / (size + 4194304)
    algbw = busbw / factor
    time_us = size / (algbw * 1e3)
    printf "%12d  %12d     float  %6s      -1  %8.1f  %6.2f  %6.2f      0  %8.1f  %6.2f  %6.2f      0\n", size, size / 4, redop, time_us, algbw, busbw, time_us, algbw, busbw
    total += busbw; rows += 1
  }
  print "# Out of bounds values : 0 OK"
  printf "# Avg bus bandwidth    : %.4f \n", total / rows
  print "#"
}'
