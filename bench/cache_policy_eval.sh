#!/usr/bin/env bash
# Cache policy evaluation on a model's real routing (docs/cache-policy.md):
#   1. MoCE off / on without a cap / caps M: misses per token, swaps, agreement, KL, relMSE.
#   2. A restart with vs without the usage history (and with hot pins): decode hit rate and tok/s of
#      the first N tokens.
# Every row is a separate `strata run` on the same packed copy of the model, in one script run.
#
# usage: bench/cache_policy_eval.sh [--strata BIN] [--model GGUF] [--budget 25%] [-n 512]
#                                   [--lambda 1] [--caps 7,10,13] [--repeats 3] [--parts 1|2|12]
set -euo pipefail

strata=./build/strata
model=models/strata-default.gguf
budget=25%
n=512
lambda=1
caps=7,10,13
repeats=3
parts=12
while [[ $# -gt 0 ]]; do
  case "$1" in
    --strata) strata=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --lambda) lambda=$2; shift 2 ;;
    --caps) caps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;  # 1, 2 or 12
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d /tmp/strata-cache-eval.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/m.gguf"
"$strata" pack "$work/m.gguf" >/dev/null 2>&1

# Two kinds of text the default model knows (it continues Bible verses, man pages, Python, fortunes).
prose="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel"
code="def parse_args(argv):
    parser = argparse.ArgumentParser(description='Copy files')
    parser.add_argument("

# number after a prefix in a text
after() { grep -o -- "$2[0-9.e+-]*" <<<"$1" | head -1 | sed "s/^$2//"; }

common=(-m "$work/m.gguf" --temp 0 --ignore-eos -t 2 --ram-budget "$budget")

if [[ $parts == *1* ]]; then
echo "# MoCE on $(basename "$model"), budget $budget, $n greedy tokens, lambda $lambda, protect 1"
echo
echo "| text | routing | decode misses/token | decode hit | swaps/token | agreement | KL (nats/row) | relMSE (samples) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for kind in prose code; do
  prompt=${!kind}
  settings=("off|" "on, no cap|--moce $lambda --moce-sample 1")
  IFS=, read -ra cap_list <<<"$caps"
  for m in "${cap_list[@]}"; do settings+=("on, M=$m|--moce $lambda --moce-max-rank $m --moce-sample 1"); done
  for s in "${settings[@]}"; do
    label=${s%%|*}
    flags=${s#*|}
    # shellcheck disable=SC2086
    out=$("$strata" run "${common[@]}" -n "$n" -p "$prompt" $flags 2>&1 >/dev/null)
    misses=$(grep "decode experts" <<<"$out" | grep -o "misses, [0-9.]*" | sed "s/misses, //")
    hit=$(grep "decode experts" <<<"$out" | grep -o "hit [0-9.]*" | head -1 | sed "s/hit //")
    if [[ -n "$flags" ]]; then
      swaps=$(after "$out" "moce: ")
      agree=$(after "$out" "agreement ")
      kl=$(after "$out" "KL ")
      relmse=$(after "$out" "relMSE ")
      samples=$(grep -o "relMSE [^(]*(\([0-9]*\) samples" <<<"$out" | grep -o "([0-9]*" | tr -d '(')
      echo "| $kind | $label | $misses | $hit% | $swaps | $agree% | $kl | $relmse ($samples) |"
    else
      echo "| $kind | $label | $misses | $hit% | 0 | 100% | 0 | 0 |"
    fi
  done
done

fi
[[ $parts == *2* ]] || exit 0
echo
echo "# Restart with vs without usage history: $(basename "$model"), budget $budget, first $n decoded tokens (median of $repeats; min..max)"
echo
# The history comes from a first session on other text of the same kinds (2 x 1024 tokens).
rm -f "$work/history.usage"
"$strata" run "${common[@]}" -n 1024 -p "In the beginning God created the heaven and the earth." --usage "$work/history.usage" >/dev/null 2>&1
"$strata" run "${common[@]}" -n 1024 -p "import os
import sys

def main():" --usage "$work/history.usage" >/dev/null 2>&1

median() { sort -g | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%s (%s..%s)", m, a[1], a[NR]}'; }

[[ -f "$work/history.usage" ]] || { echo "the history runs wrote no $work/history.usage" >&2; exit 1; }
# Hit rate over all of the first tokens (prompt + decoded): from the prefill and decode lines.
total_hit() {
  local ph pm dh dm
  ph=$(grep "prefill experts" <<<"$1" | grep -o "([0-9]* hits" | grep -o "[0-9]*")
  pm=$(grep "prefill experts" <<<"$1" | grep -o "hits, [0-9]* misses" | grep -o "[0-9]*")
  dh=$(grep "decode experts" <<<"$1" | grep -o "([0-9]* hits" | grep -o "[0-9]*")
  dm=$(grep "decode experts" <<<"$1" | grep -o "hits, [0-9]* misses" | grep -o "[0-9]*")
  awk -v a="$ph" -v b="$pm" -v c="$dh" -v d="$dm" 'BEGIN { printf "%.1f", 100 * (a + c) / (a + b + c + d) }'
}

echo "| text | start | prompt hit | prompt + $n decoded: hit | decode misses/token | decode tok/s |"
echo "|---|---|---:|---:|---:|---:|"
for kind in prose code; do
  prompt=${!kind}
  for s in "cold (no history)|" "history fill|--usage H" "history fill + 4 pins|--usage H --pin 4" \
           "cold + 4 prompt-hot pins|--pin-hot 4" "history + 4 prompt-hot pins|--usage H --pin-hot 4"; do
    label=${s%%|*}
    flags=${s#*|}
    phits=() hits=() missv=() tps=()
    for ((r = 0; r < repeats; ++r)); do
      cp "$work/history.usage" "$work/run.usage"  # every repeat starts from the same history
      # shellcheck disable=SC2086
      out=$("$strata" run "${common[@]}" -n "$n" -p "$prompt" ${flags//H/$work/run.usage} 2>&1 >/dev/null)
      phits+=("$(grep "prefill experts" <<<"$out" | grep -o "hit [0-9.]*" | head -1 | sed "s/hit //")")
      hits+=("$(total_hit "$out")")
      missv+=("$(grep "decode experts" <<<"$out" | grep -o "misses, [0-9.]*" | sed "s/misses, //")")
      tps+=("$(grep -o "generated [0-9]* tokens in [0-9.]* s ([0-9.]*" <<<"$out" | grep -o "([0-9.]*" | tr -d '(')")
    done
    echo "| $kind | $label | $(printf '%s\n' "${phits[@]}" | median)% | $(printf '%s\n' "${hits[@]}" | median)% | $(printf '%s\n' "${missv[@]}" | median) | $(printf '%s\n' "${tps[@]}" | median) |"
  done
done
