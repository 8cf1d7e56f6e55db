#!/usr/bin/env bash
# --spec outside `strata run`'s plain path, end to end through the binary:
# - `strata chat` (multi-turn, a /reset, greedy and sampled with a seed) prints exactly what it
#   prints without --spec, for mtp/suffix/both, depths 1 and 3, gate on and off, on the embedded
#   default model (a synthetic tiny-qwen4exp with a tokenizer, which has no MTP head: suffix
#   only); with --spec it prints the spec
#   line at exit, and the MTP head's drafts do stand on the default model (the path is taken);
# - `strata run --spec both --telemetry`: the same ids as without --spec, and the telemetry
#   windows account for every fed token, their drafts and acceptances add up to the spec line.
# Usage: spec_cli_test.sh STRATA TOKENIZER_DIR DEFAULT_MODEL
set -euo pipefail
strata=$(realpath "$1")
tokenizer_dir=$(realpath "$2")
default_model=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$strata" synth --shape tiny-qwen4exp --tokenizer "$tokenizer_dir" "$work/tiny.gguf" 2>/dev/null

turns=$'And the LORD spake unto Moses, saying,\nsay it again, say it again, say it again\n/reset\nNAME\n       grep - print lines that match patterns\n/quit\n'
chat() {  # chat MODEL NAME ARGS...: stdout to NAME.out, stderr to NAME.err
  local model=$1 name=$2
  shift 2
  printf '%s' "$turns" | "$strata" chat -m "$model" -t 1 --max-reply 40 "$@" \
    >"$work/$name.out" 2>"$work/$name.err" || { tail -5 "$work/$name.err"; fail "chat $* exited with an error"; }
}

accepted_default=0
for model in "$default_model" "$work/tiny.gguf"; do
  for sampling in "--temp 0" "--temp 0.8 --top-p 0.95 --seed 11"; do
    # shellcheck disable=SC2086
    chat "$model" plain $sampling
    ! grep -q "spec:" "$work/plain.err" || fail "a spec line without --spec"
    [ "$(grep -c '^> ' "$work/plain.out")" -ge 1 ] || fail "no prompt in the chat output"
    configs=("mtp 3 on" "mtp 2 off" "suffix 3 on" "both 1 on" "both 1 off" "both 3 on" "both 3 off")
    # The synthetic model has no MTP head: prompt lookup only.
    [ "$model" = "$default_model" ] || configs=("suffix 1 on" "suffix 3 on" "suffix 3 off")
    for config in "${configs[@]}"; do
      read -r mode depth gate <<<"$config"
      # shellcheck disable=SC2086
      chat "$model" spec $sampling --spec "$mode" --draft-max "$depth" --spec-gate "$gate"
      cmp -s "$work/plain.out" "$work/spec.out" || {
        diff "$work/plain.out" "$work/spec.out" | head -20
        fail "$(basename "$model") $sampling --spec $mode --draft-max $depth --spec-gate $gate: chat output differs"
      }
      line=$(grep "^strata: spec: " "$work/spec.err") || fail "no spec line at exit ($config)"
      [[ $line =~ drafts\ proposed\ ([0-9]+)\ accepted\ ([0-9]+) ]] || fail "spec line without drafts: $line"
      (( BASH_REMATCH[2] <= BASH_REMATCH[1] )) || fail "more drafts accepted than proposed: $line"
      # Fixed depth always drafts (the gate's picks follow wall times and may decline them all).
      if [ "$model" = "$default_model" ] && [ "$mode" = mtp ] && [ "$gate" = off ]; then
        accepted_default=$((accepted_default + BASH_REMATCH[2]))
      fi
    done
  done
done
[ "$accepted_default" -gt 0 ] || fail "no MTP draft stood in any default-model chat: the spec path was not taken"

# A model without an MTP head: serve refuses --spec mtp at start (not with a 500 per request).
if timeout 30 "$strata" serve -m "$work/tiny.gguf" --port 0 -t 1 --spec mtp >/dev/null 2>"$work/serve.err"; then
  fail "serve --spec mtp started on a model without an MTP head"
fi
grep -q "needs an MTP (nextn) head" "$work/serve.err" || { cat "$work/serve.err"; fail "serve --spec mtp: no error naming the missing head"; }

# run --telemetry with --spec: greedy (the MTP head drafts well on this text) and sampled.
prompt="And the LORD spake unto Moses, saying,"
n=60
# Gate off for the sampled run: fixed depth drafts every window, so "a draft stood" is decided by the
# seed, not by wall times.
for config in "on --temp 0" "off --temp 0.8 --seed 3"; do
  read -r gate sampling <<<"$config"
  # shellcheck disable=SC2086
  "$strata" run -m "$default_model" -t 1 -p "$prompt" -n $n --ignore-eos --print-ids $sampling \
    >"$work/run-plain.out" 2>"$work/run-plain.err" || fail "plain run failed"
  # shellcheck disable=SC2086
  "$strata" run -m "$default_model" -t 1 -p "$prompt" -n $n --ignore-eos --print-ids $sampling \
    --spec both --spec-gate "$gate" --telemetry "$work/t.jsonl" >"$work/run-spec.out" 2>"$work/run-spec.err" ||
    { tail -5 "$work/run-spec.err"; fail "run --spec both --telemetry failed"; }
  cmp -s "$work/run-plain.out" "$work/run-spec.out" || fail "run $sampling --spec-gate $gate: --spec changed the ids"
  python3 - "$work/t.jsonl" "$work/run-spec.out" "$work/run-spec.err" "$n" <<'PY' || fail "telemetry ($sampling)"
import json, re, sys
windows = [json.loads(line) for line in open(sys.argv[1])]
ids = [int(x) for x in open(sys.argv[2]).read().strip().split(",")]
n = int(sys.argv[4])
assert len(ids) == n, (len(ids), n)
fed = 0
for w in windows:
    assert w["token"] == fed, ("windows must follow each other", w, fed)
    assert w["id"] == ids[w["token"]], ("the window's first token is the emitted one", w)
    assert w["rows"] == 1 + w["drafted"], w
    assert 0 <= w["accepted"] <= w["drafted"], w
    assert w["kept"] == 1 + w["accepted"], w  # no stop token with --ignore-eos
    assert w["ms"] >= 0, w
    fed += w["kept"]
assert fed == n - 1, ("every emitted token but the last is fed", fed, n)
line = re.search(r"drafts proposed (\d+) accepted (\d+) \(\d+%\) in (\d+) verifies",
                 open(sys.argv[3]).read())
assert line, "no spec line"
proposed, accepted, verifies = map(int, line.groups())
assert proposed == sum(w["drafted"] for w in windows), (proposed, windows)
assert accepted == sum(w["accepted"] for w in windows), (accepted, windows)
assert verifies == sum(1 for w in windows if w["drafted"] > 0), verifies
assert accepted > 0, "no draft stood"
print(f"telemetry: {len(windows)} windows for {n} tokens, drafts {proposed} proposed {accepted} accepted")
PY
done
echo "PASS: chat and run --telemetry with --spec match the plain path"
