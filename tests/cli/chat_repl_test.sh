#!/usr/bin/env bash
# `strata chat` in a real terminal (tmux): a reply streams, Ctrl-C stops it without killing the
# program, /stats and /reset answer, and /quit exits.
# Usage: chat_repl_test.sh STRATA MODEL (the default model: its reply to a context of 4096 tokens
# lasts ~2.4 s at 1 thread on the build VM; the synthesized tiny model's lasted 0.45 s, under the
# 0.5 s after which the Ctrl-C comes, once PLE rows stopped taking a thread hop a token)
set -euo pipefail
# Absolute paths: the tmux server runs the command from its own working directory.
strata=$(realpath "$1")
model=$(realpath "$2")
work=$(mktemp -d)
session="strata-chat-$$"  # also the name of a private tmux server (-L): no clash with others
cleanup() { tmux -L "$session" kill-session -t "$session" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- pane:"; tmux -L "$session" capture-pane -p -t "$session" 2>/dev/null || true; exit 1; }

# The pane runs a bash script via exec: tmux starts panes with $SHELL -c, and when that is dash
# (SHELL unset in CI) the waiting shell itself dies of the Ctrl-C meant for strata, closing the
# pane. bash waits cooperatively and carries on when the child handled SIGINT.
cat > "$work/pane.sh" <<EOF
#!/usr/bin/env bash
"$strata" chat -m "$model" --temp 0 --show-thinking --ignore-eos --max-reply 1000000 -t 1
echo EXITED-\$?
sleep 30
EOF
chmod +x "$work/pane.sh"
tmux -L "$session" -f /dev/null new-session -d -s "$session" -x 200 -y 50 "exec $work/pane.sh"

wait_for() {  # wait_for PATTERN SECONDS
  for _ in $(seq 1 $(( $2 * 10 ))); do
    # -J joins wrapped lines: a marker like "[stopped]" can otherwise be split at the pane's edge.
    tmux -L "$session" capture-pane -p -J -t "$session" 2>/dev/null | grep -q -- "$1" && return 0
    sleep 0.1
  done
  return 1
}

wait_for "strata chat:" 20 || fail "banner did not appear"
tmux -L "$session" send-keys -t "$session" "tell me a story" Enter
# The default model streams ~1700 tokens a second on one thread here and fills its 4096-token
# context in ~2.4 s, so Ctrl-C comes soon after the reply starts.
sleep 0.5
tmux -L "$session" send-keys -t "$session" C-c
wait_for "\[stopped\]" 10 || fail "Ctrl-C did not stop the reply"
tmux -L "$session" send-keys -t "$session" "/stats" Enter
wait_for "context [0-9]* tokens" 10 || fail "/stats did not answer after Ctrl-C"
tmux -L "$session" send-keys -t "$session" "/reset" Enter
wait_for "(conversation cleared)" 10 || fail "/reset did not answer"
tmux -L "$session" send-keys -t "$session" "/quit" Enter
wait_for "EXITED-0" 10 || fail "/quit did not exit with status 0"
# A reply that fills the context ends with a note and the REPL stays usable (it used to exit).
out=$(printf 'tell me a story\n/stats\n/quit\n' |
      "$strata" chat -m "$model" --temp 0 --ignore-eos --max-reply 1000000 -t 1 2>&1) ||
  { echo "$out" | tail -5; echo "FAIL: chat exited with an error when the context filled"; exit 1; }
grep -q "\[context full" <<<"$out" || { echo "FAIL: no context-full note"; exit 1; }
grep -q "context 4096 tokens" <<<"$out" || { echo "FAIL: /stats after a full context"; exit 1; }
echo "PASS: chat REPL streams, stops on Ctrl-C, answers /stats and /reset, exits on /quit"
