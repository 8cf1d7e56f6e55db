#!/usr/bin/env python3
"""Time to first token per turn of one conversation against `strata serve`, with and without the
conversation state cache (issue 17 item 1).

    python3 bench/serve/conversation_ttft.py --binary build/strata [--turns 6] [--max-tokens 48]

Starts the server twice on loopback (default --cache-ram, then --cache-ram 0), sends the same
conversation (greedy, thinking off so replies go back into the history as generated), streamed,
and measures on the client the time from sending the request to the first content chunk. Prints
one row per turn: prompt tokens, cached tokens, TTFT with and without the cache; --json-out
writes them. No network beyond localhost.
"""
import argparse
import http.client
import json
import re
import sys
import time

from serve_process import start_server

SYSTEM = (
    "You are a helpful travel assistant for a small agency that plans trips by public transport. "
    "Answer in plain English, in short paragraphs or lists, and be concrete: name towns, stations, "
    "bus companies and approximate times and prices where you can, and say when you are not sure. "
    "Prefer slow travel: fewer places, more time in each. Mention accessibility when it matters, "
    "and point out seasonal closures, strikes and holidays that often disrupt services. Never "
    "invent opening hours; suggest checking the official site instead. If the traveller asks for "
    "a plan, give a day-by-day outline first and details after it. Keep the tone friendly and "
    "brief, and do not repeat the question back. The traveller is an adult in good health, "
    "travelling alone, with a medium budget and a carry-on bag only.")

QUESTIONS = [
    "I am planning a week-long trip along the coast of Portugal in late spring. I like walking, "
    "old towns, seafood and small museums, and I will travel by train and bus only. Suggest a "
    "route from Porto to Lisbon with where to stay each night and one thing not to miss in each "
    "place, and say which legs are the slowest on public transport.",
    "That sounds good. Now add two days in the Algarve at the end and tell me how to get there "
    "from Lisbon without a car, with the rough travel time.",
    "What should I pack for the weather in that season, and are there any local festivals in "
    "May or early June along this route that I could fit in?",
    "Give me a short budget estimate per day for food, lodging and transport, in euros, for a "
    "mid-range traveller.",
    "Which two places would you drop if I had only five days instead of seven, and why?",
    "Finally, summarise the whole plan as a day-by-day list, one line per day.",
]


def chat_turn(port, messages, max_tokens):
    body = json.dumps({
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    })
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft = None
    text = ""
    usage = None
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode().removeprefix("data: ")
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for choice in obj.get("choices", []):
                delta = choice.get("delta", {})
                piece = delta.get("content") or delta.get("reasoning_content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - start
                text += delta.get("content") or ""
    conn.close()
    return ttft, text, usage


def run(binary, extra, turns, max_tokens):
    proc, port = start_server(binary, extra)
    rows = []
    try:
        messages = [{"role": "system", "content": SYSTEM}]
        for turn in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            ttft, text, usage = chat_turn(port, messages, max_tokens)
            messages.append({"role": "assistant", "content": text})
            rows.append({"turn": turn + 1, "ttft_ms": round(ttft * 1000, 1),
                         "prompt_tokens": usage["prompt_tokens"],
                         "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                         "reply": text})
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--cache-ram", default="", help="--cache-ram for the cached run (default: the server's)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    cached = run(args.binary, ["--cache-ram", args.cache_ram] if args.cache_ram else [], args.turns,
                 args.max_tokens)
    plain = run(args.binary, ["--cache-ram", "0"], args.turns, args.max_tokens)
    print("turn  prompt  cached  ttft_cache_ms  ttft_nocache_ms  same_reply")
    for c, p in zip(cached, plain):
        print(f"{c['turn']:>4}  {c['prompt_tokens']:>6}  {c['cached_tokens']:>6}  "
              f"{c['ttft_ms']:>13}  {p['ttft_ms']:>15}  {c['reply'] == p['reply']}")
    print(f"turn {args.turns} / turn 1 TTFT: cache {cached[-1]['ttft_ms'] / cached[0]['ttft_ms']:.2f}x, "
          f"no cache {plain[-1]['ttft_ms'] / plain[0]['ttft_ms']:.2f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"cache": cached, "no_cache": plain}, f, indent=1)


if __name__ == "__main__":
    main()
