#!/usr/bin/env python3
"""Time to first token of one long prompt against `strata serve` at several prefill windows
(`--chunk`, session 47), alternated so that a shared machine's load lands on every side alike.

    python3 bench/serve/prompt_window_ttft.py --binary build/strata -m /tmp/m.gguf \\
        --chunks 64,512 --rounds 6 --words 700 --threads 2 [--before OLD/strata]

Starts one server per --chunk value (loopback, port 0, --quiet, the default --cache-ram) and keeps
them all up; each round sends every server the same new prompt (a different first word per round,
so no state cache entry prefixes it) as a /v1/completions request for one greedy token, in the next
rotation of the servers' order, and times the request on the client: the prefill and one draw,
i.e. the time to the first token. Then each server gets one more prompt of the same length for 16
greedy tokens, which must come out the same on every server (the windows must not change the
tokens). --before adds a server of another binary (without --chunk: a build from before it
existed) as the first side. Prints every request, then per side the median ms and prompt tok/s
(prompt tokens / median seconds) and the ratios to the first side. No network beyond localhost.
"""
import argparse
import http.client
import json
import statistics
import sys
import time

from serve_process import start_server

WORDS = ("the harbour town wakes early and the fishing boats come in before the market opens "
         "while walkers follow the cliff path past old chapels small museums and cafes that sell "
         "grilled sardines bread and strong coffee to travellers waiting for the slow train").split()


def prompt_text(first_word, n_words):
    words = [first_word] + [WORDS[i % len(WORDS)] for i in range(n_words - 1)]
    return " ".join(words)


def complete(port, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1200)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    seconds = time.perf_counter() - start
    conn.close()
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {data[:500]!r}")
    obj = json.loads(data)
    return seconds, obj["choices"][0]["text"], obj["usage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--chunks", default="64,512")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--words", type=int, default=700)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before", help="a binary from before --chunk existed: one more side, first")
    ap.add_argument("--json-out")
    opts = ap.parse_args()
    common = ["-m", opts.model, "-t", str(opts.threads)]
    sides = {}  # label -> (binary, args)
    if opts.before:
        sides["before"] = (opts.before, common)
    for c in opts.chunks.split(","):
        sides[f"--chunk {c}"] = (opts.binary, common + ["--chunk", c])
    chunks = list(sides)  # the side labels, in table order
    servers = {}
    try:
        for c in chunks:
            servers[c] = start_server(*sides[c])
        # A warm-up request each (page cache, first-touch buffers), not timed.
        for c in chunks:
            complete(servers[c][1], prompt_text("warm", opts.words), 1)
        times = {c: [] for c in chunks}
        prompt_tokens = None
        for r in range(opts.rounds):
            order = chunks[r % len(chunks):] + chunks[:r % len(chunks)]
            for c in order:
                seconds, _, usage = complete(servers[c][1], prompt_text(f"round{r}", opts.words), 1)
                if usage.get("prompt_tokens_details", {}).get("cached_tokens", 0):
                    sys.exit(f"round {r}: {c} resumed from the cache")
                prompt_tokens = usage["prompt_tokens"]
                times[c].append(seconds)
                print(f"round {r} {c}: {prompt_tokens} prompt tokens, {seconds * 1000:.0f} ms",
                      flush=True)
        texts = {c: complete(servers[c][1], prompt_text("check", opts.words), 16)[1] for c in chunks}
        same = len(set(texts.values())) == 1
        print(f"16 greedy tokens the same on every side: {same}")
        base = statistics.median(times[chunks[0]])
        print(f"\n{prompt_tokens}-token prompt, {opts.threads} threads, {opts.rounds} rounds")
        print(f"| side | median ms | prompt tok/s | vs {chunks[0]} |")
        print("|---:|---:|---:|---:|")
        for c in chunks:
            med = statistics.median(times[c])
            print(f"| {c} | {med * 1000:.0f} | {prompt_tokens / med:.1f} | {base / med:.2f}x |")
        if opts.json_out:
            with open(opts.json_out, "w") as f:
                json.dump({"prompt_tokens": prompt_tokens, "times_s": times, "same_text": same,
                           "texts": texts}, f, indent=1)
        if not same:
            sys.exit("the windows changed the tokens: " + json.dumps(texts))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
