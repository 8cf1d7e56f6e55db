#!/usr/bin/env bash
# ONE device call (~3 min): what bounds a quantized matvec kernel. Builds bench_cuda_matvec and
# runs Nsight Compute's full section set over one launch of the matmul kernel per type (after the
# warm-up launches), on the bench's default 8192 x 16384 shape, window T (default 1). Prints the
# lines that answer "memory, issue or shared memory?": DRAM and SM throughput, issue slots busy,
# the warp stall reasons, shared-memory wavefronts and bank conflicts, registers and occupancy.
# From the project root, carrying [".device/cuda-kit"]:
#   OUT=$OUT [TYPES=iq2_xs,q8_0] [ROWS=1] [SKIP=40] scripts/cuda-ncu-matvec.sh
# Outputs under $OUT: build.log, ncu-TYPE.txt (the whole details page per type), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cuda-ncu-matvec}
mkdir -p "$out"
source .device/cuda-kit/env.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_WERROR=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
ninja -C build-cuda -j "$(nproc)" bench_cuda_matvec >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
for type in $(echo "${TYPES:-iq2_xs,q8_0}" | tr ',' ' '); do
  timeout 200 "$ncu" --set full --import-source no -k regex:matmul --launch-skip "${SKIP:-40}" --launch-count 1 \
    ./build-cuda/bench/bench_cuda_matvec --types "$type" --rows "${ROWS:-1}" >"$out/ncu-$type.txt" 2>&1
  echo "=== $type (ncu rc=$?)" | tee -a "$out/summary.txt"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Registers Per|Achieved Occupancy|Theoretical Occupancy|Shared (Load|Store)|Bank Conflict|L1/TEX Hit|L2 Hit|Executed Ipc|Stall|Warp Cycles Per|Block Limit|est\. speedup|Mem Busy|Max Bandwidth|Dynamic Shared" \
    "$out/ncu-$type.txt" | head -70 | tee -a "$out/summary.txt"
  # The stall reasons, per issued instruction (which of them a warp waits on most).
  timeout 120 "$ncu" -k regex:matmul --launch-skip "${SKIP:-40}" --launch-count 1 --csv --page raw \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    ./build-cuda/bench/bench_cuda_matvec --types "$type" --rows "${ROWS:-1}" >"$out/stalls-$type.csv" 2>&1
  python3 - "$out/stalls-$type.csv" <<'PY' | tee -a "$out/summary.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if len(rows) >= 3:
    head, vals = rows[0], rows[-1]
    pairs = []
    for h, v in zip(head, vals):
        if h.startswith("smsp__average_warps_issue_stalled_"):
            try: pairs.append((float(v.replace(",", "")), h[34:].replace("_per_issue_active.ratio", "")))
            except ValueError: pass
    for v, name in sorted(pairs, reverse=True)[:10]: print(f"  stall {name:28s} {v:8.3f}")
PY
done
