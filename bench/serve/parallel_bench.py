#!/usr/bin/env python3
"""Continuous batching bench for `strata serve --parallel` (docs/serve.md, "Parallel requests").

For each --parallel value P (default 1 and 16) it starts one server and, for each stream count N
(default 1, 4, 16), sends N streaming completions at once (distinct prompts, greedy, ignore_eos,
--max-tokens each), --runs times. Per run: aggregate tok/s (completion tokens of all N over the
wall time from the first request sent to the last [DONE]), time to first token (request sent ->
first text chunk) and inter-token latency (gaps between a stream's text chunks; one chunk per
token unless a UTF-8 character spans tokens), p50/p95 over all streams of the run. Reported:
medians over the runs, and the ratio of each P to the first P at the same N. From /metrics
around each N: batched steps, rows per step and, per routed layer of a step, the experts fetched
(the union over its rows) next to rows x top-k (what separate windows would fetch).

Then a load test: --load-streams clients (default 64) sending streaming requests back to back for
--load-seconds against each server: requests, errors (must be 0), aggregate tok/s, p50/p95 latency.

The replies of every P are also compared (greedy, same prompts): they must be equal.

  python3 bench/serve/parallel_bench.py --binary build/strata
  python3 bench/serve/parallel_bench.py --binary build/strata --model mid.gguf --server-args "--ram-budget 50%"
stdlib only.
"""
import argparse
import http.client
import json
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))]


class Server:
    def __init__(self, binary, model, parallel, extra):
        argv = [binary, "serve", "--port", "0", "--quiet", "--parallel", str(parallel), "--max-queue", "256",
                "--max-connections", "400"]
        if model:
            argv += ["-m", model]
        argv += extra
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"http://[^:]+:(\d+)", line)
        if not match:
            raise RuntimeError(f"server did not start: {line}{self.proc.stderr.read()}")
        self.port = int(match.group(1))

    def metrics(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def props(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/props")
        return json.loads(conn.getresponse().read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def stream(port, prompt, max_tokens, result):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        result.update(error=f"HTTP {resp.status}: {resp.read()[:200]}")
        return
    chunks, text, tokens = [], "", 0
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        c = json.loads(data)
        if c.get("usage"):
            tokens = c["usage"]["completion_tokens"]
        for choice in c.get("choices", []):
            if choice.get("text"):
                chunks.append(time.monotonic())
                text += choice["text"]
    result.update(sent=sent, done=time.monotonic(), chunks=chunks, text=text, tokens=tokens)


def burst(port, n, max_tokens, tag):
    results = [dict() for _ in range(n)]
    threads = [threading.Thread(target=stream, args=(port, f"Stream {tag}-{i}: And God said", max_tokens, results[i]))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(errors[0])
    first = min(r["sent"] for r in results)
    last = max(r["done"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["chunks"][0] - r["sent"] for r in results if r["chunks"]]
    itl = [b - a for r in results for a, b in zip(r["chunks"], r["chunks"][1:])]
    return {"tok_s": tokens / (last - first), "ttft_p50": percentile(ttft, 50), "itl_p50": percentile(itl, 50),
            "itl_p95": percentile(itl, 95), "texts": [r["text"] for r in results]}


def load(port, clients, seconds, max_tokens):
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    stats = {"ok": 0, "errors": 0, "tokens": 0, "latency": []}

    def client(i):
        k = 0
        while time.monotonic() < stop_at:
            r = {}
            try:
                stream(port, f"Load {i}-{k}: In the beginning", max_tokens, r)
            except Exception as e:  # noqa: BLE001 - counted as an error
                r = {"error": str(e)}
            k += 1
            with lock:
                if "error" in r:
                    stats["errors"] += 1
                else:
                    stats["ok"] += 1
                    stats["tokens"] += r["tokens"]
                    stats["latency"].append(r["done"] - r["sent"])

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    return {"ok": stats["ok"], "errors": stats["errors"], "tok_s": stats["tokens"] / wall,
            "lat_p50": percentile(stats["latency"], 50), "lat_p95": percentile(stats["latency"], 95)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--parallel", default="1,16")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load-streams", type=int, default=64)
    ap.add_argument("--load-seconds", type=float, default=20)
    ap.add_argument("--load-max-tokens", type=int, default=16)
    args = ap.parse_args()
    parallels = [int(p) for p in args.parallel.split(",")]
    streams = [int(n) for n in args.streams.split(",")]
    extra = shlex.split(args.server_args)
    table, texts = {}, {}
    for p in parallels:
        server = Server(args.binary, args.model, p, extra)
        try:
            props = server.props()
            top_k = props["strata"]["experts"]["n_expert_used"]
            groups = props["strata"].get("batch_groups")
            if groups:  # what --batch-groups (auto by default) chose, and why
                print(f"parallel {p:>2} batch groups {groups['groups']}: {groups['reason']}", flush=True)
            burst(server.port, 1, 4, "warmup")
            for n in streams:
                before = server.metrics()
                # A new prompt per run and stream: nothing comes from the conversation state cache.
                runs = [burst(server.port, n, args.max_tokens, f"{n}.{k}") for k in range(args.runs)]
                after = server.metrics()
                d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                steps = d.get("strata_batch_steps_total", 0)
                rows = d.get("strata_batch_rows_total", 0)
                layers = d.get("strata_batch_layer_steps_total", 0)
                union = d.get("strata_expert_union", d.get("strata_batch_expert_union_total", 0))
                row = {k: statistics.median(r[k] for r in runs) for k in ("tok_s", "ttft_p50", "itl_p50", "itl_p95")}
                row["rows_per_step"] = rows / steps if steps else 1.0
                row["union_per_layer"] = union / layers if layers else float("nan")
                row["rows_x_k"] = row["rows_per_step"] * top_k
                table[(p, n)] = row
                texts[(p, n)] = runs[0]["texts"]
                print(f"parallel {p:>2} streams {n:>2}: {row['tok_s']:7.1f} tok/s  ttft p50 {row['ttft_p50']*1e3:7.0f} ms  "
                      f"itl p50 {row['itl_p50']*1e3:6.1f} ms p95 {row['itl_p95']*1e3:6.1f} ms  rows/step "
                      f"{row['rows_per_step']:5.2f}  experts/layer-step {row['union_per_layer']:6.1f} "
                      f"(rows x top-{top_k} = {row['rows_x_k']:5.1f})", flush=True)
            if args.load_streams > 0:
                lr = load(server.port, args.load_streams, args.load_seconds, args.load_max_tokens)
                table[(p, "load")] = lr
                print(f"parallel {p:>2} load {args.load_streams} streams x {args.load_seconds:.0f} s: {lr['ok']} ok, "
                      f"{lr['errors']} errors, {lr['tok_s']:.1f} tok/s, latency p50 {lr['lat_p50']:.2f} s p95 "
                      f"{lr['lat_p95']:.2f} s", flush=True)
        finally:
            server.stop()
    base = parallels[0]
    print("\n| streams | " + " | ".join(f"--parallel {p} tok/s" for p in parallels) + " | ratio |")
    print("|---:|" + "---:|" * len(parallels) + "---:|")
    for n in streams:
        vals = [table[(p, n)]["tok_s"] for p in parallels]
        print(f"| {n} | " + " | ".join(f"{v:.1f}" for v in vals) + f" | {vals[-1] / vals[0]:.2f}x |")
    same = all(texts[(p, n)] == texts[(base, n)] for p in parallels for n in streams)  # run 0 each
    print(f"\nreplies equal across --parallel values: {same}")
    if (base, 1) in table:  # the "x one stream" lines need a run of one stream (--streams 1,...)
        single = table[(base, 1)]["tok_s"]
        for p in parallels:
            for n in streams:
                print(f"  parallel {p} streams {n}: {table[(p, n)]['tok_s'] / single:.2f}x one stream on --parallel {base}")
    errors = sum(table[(p, 'load')]["errors"] for p in parallels if (p, "load") in table)
    return 0 if same and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
