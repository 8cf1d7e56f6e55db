#!/usr/bin/env bash
# The flagship's compute ceiling on this CPU (docs/bench-experts.md, "The flagship at full scale"):
# decode tok/s with every weight resident, no expert I/O at all.  The 48-layer file does not fit in
# RAM, so subsets of the same shape (qwen3.8-flash-next, all 512 experts, full vocabulary, --layers L)
# are written to /dev/shm (tmpfs: RAM) and decoded through the mapping (--mapped-experts: no store,
# no reads); the per-token time is fitted as a + b*L over LAYERS and extrapolated to 48 layers.
# L = 4 and 8 keep the hybrid pattern (every 4th layer attention); L = 1 and 2 do not (and llama.cpp
# refuses them: PLE layer 1 out of range, no KV layer).
#
# Usage: bench/flagship_compute_ceiling.sh OUT_DIR [LAYERS (default "4 8")]
# Environment: STRATA (/tmp/flagship/strata), THREADS (2), N (40), REPEATS (2), TOKENIZER (the
# 248320-id tokenizer from bench/make_flagship_tokenizer.py, default /tmp/flagship/tok248k).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1 layers=${2:-4 8}
strata=${STRATA:-/tmp/flagship/strata} threads=${THREADS:-2} n=${N:-40} repeats=${REPEATS:-2}
tok=${TOKENIZER:-/tmp/flagship/tok248k}
mkdir -p "$out"
for L in $layers; do
  f=/dev/shm/flagship-L$L.gguf
  "$strata" synth --shape qwen3.8-flash-next --layers "$L" --type q8_0 --expert-type iq2_xs --tokenizer "$tok" \
    --threads "$threads" "$f"
  # one untimed pass so the run below starts with everything mapped warm
  "$strata" run -m "$f" --tokens 1,2,3,4 -n 2 --temp 0 --ignore-eos --print-ids -t "$threads" --mapped-experts >/dev/null 2>&1
  for rep in $(seq 1 "$repeats"); do
    python3 "$here/flagship_measure.py" --no-drop --out "$out/resident-L$L-$rep.json" -- "$strata" run -m "$f" \
      --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n "$n" --temp 0 --ignore-eos --print-ids -t "$threads" \
      --mapped-experts --profile
  done
  rm -f "$f"
done
python3 - "$out" <<'EOF'
import glob, json, re, statistics, sys
out = sys.argv[1]
per = {}
for p in glob.glob(f"{out}/resident-L*-*.json"):
    L = int(re.search(r"-L(\d+)-", p).group(1))
    r = json.load(open(p))
    for t, line in r["stderr"]:
        if line.startswith("strata: profile per decoded token"):
            per.setdefault(L, []).append(float(re.search(r"token: ([\d.]+) ms", line).group(1)))
        if line.startswith("strata: prompt"):
            print(p, line[8:], "load", r["load1_min_max"])
ls = sorted(per)
ms = {L: statistics.median(v) for L, v in per.items()}
for L in ls:
    print(f"L={L}: ms/token {ms[L]:.1f} (runs {per[L]})")
if len(ls) >= 2:
    (l0, l1) = ls[0], ls[-1]
    b = (ms[l1] - ms[l0]) / (l1 - l0)
    a = ms[l0] - b * l0
    t48 = a + 48 * b
    print(f"fit: {a:.1f} ms + {b:.2f} ms/layer -> 48 layers {t48:.0f} ms/token = compute ceiling {1000 / t48:.2f} tok/s")
EOF
