#!/usr/bin/env python3
"""Bounded load test of `strata serve` against loopback.

CONCURRENCY clients each send streaming requests back to back for DURATION seconds (alternating
/v1/chat/completions and /v1/completions, stream_options.include_usage, random seeds) and check
every response: HTTP 200, every SSE event `data: <json>`, a finish_reason, the usage chunk and
`data: [DONE]` last. Before the measured run, a warm-up of the same load lets the server reach its
steady state (connection threads started, allocator arenas sized); RSS is read from
/proc/PID/status after the warm-up and after the run.

Prints errors (must be 0), latency and time-to-first-token percentiles, throughput and RSS before
and after; exits 1 when a request failed, when RSS grew by more than --rss-margin-mib (negative:
report only), or when the server does not exit 0 on SIGTERM. stdlib only.

  tests/serve/load_test.py --binary build/strata --duration 10     # CI (ctest ServeLoad.*)
  bench/serve/load.sh build                                         # 60 s (docs/serve.md)
  bench/serve/load_parallel.sh build                                # 64 streams x 10 min, --parallel 8
"""
import argparse
import http.client
import json
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time


class RequestFailed(Exception):
    pass


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def metric_values(port, names):
    """The values of unlabelled or fully labelled series of the server's /metrics (nan: absent)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values = {}
    for name in names:
        match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
        values[name] = float(match.group(1)) if match else float("nan")
    return values


def heap_mib(port):
    """(in use, free) MiB of the server's malloc arenas, from /metrics (strata_heap_*_bytes; the
    mmapped chunks, a few large buffers that come and go, are left out)."""
    arena, free = 'strata_heap_in_use_bytes{kind="arena"}', "strata_heap_free_bytes"
    values = metric_values(port, (arena, free))
    return values[arena] / 1048576.0, values[free] / 1048576.0


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def request_body(index, max_tokens, rng):
    common = {"max_tokens": max_tokens, "temperature": 0.8, "seed": rng.randrange(1 << 31), "stream": True,
              "stream_options": {"include_usage": True}}
    if index % 2 == 0:
        return "/v1/chat/completions", dict(common, messages=[{"role": "user", "content": f"Tell me about {index}."}],
                                            chat_template_kwargs={"enable_thinking": False})
    return "/v1/completions", dict(common, prompt=f"And it came to pass {index}")


def stream_once(port, path, body, timeout_s):
    """One streamed request; returns (latency_s, ttft_s, completion_tokens). Raises RequestFailed."""
    start = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    phase = "sending the request"
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        phase = "waiting for the response headers"
        response = connection.getresponse()
        phase = "reading the stream"
        if response.status != 200:
            raise RequestFailed(f"{path}: HTTP {response.status}: {response.read()[:300]!r}")
        if response.getheader("Content-Type") != "text/event-stream":
            raise RequestFailed(f"{path}: Content-Type {response.getheader('Content-Type')}")
        ttft = None
        finish = None
        usage = None
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            if done:
                raise RequestFailed(f"{path}: data after [DONE]: {line[:200]!r}")
            if not line.startswith(b"data: "):
                raise RequestFailed(f"{path}: not an SSE data line: {line[:200]!r}")
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RequestFailed(f"{path}: error event {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                text = choice.get("text") or choice.get("delta", {}).get("content") \
                    or choice.get("delta", {}).get("reasoning_content")
                if text and ttft is None:
                    ttft = time.monotonic() - start
                finish = choice.get("finish_reason") or finish
        if not done:
            raise RequestFailed(f"{path}: stream ended without data: [DONE]")
        if finish not in ("stop", "length"):
            raise RequestFailed(f"{path}: finish_reason {finish!r}")
        if usage is None:
            raise RequestFailed(f"{path}: no usage chunk")
        latency = time.monotonic() - start
        return latency, ttft if ttft is not None else latency, usage["completion_tokens"]
    except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
        raise RequestFailed(f"{path}: {type(error).__name__} while {phase} after "
                            f"{time.monotonic() - start:.2f} s: {error}") from error
    finally:
        connection.close()


def run_load(port, concurrency, duration_s, max_tokens, timeout_s, seed):
    results = {"latency": [], "ttft": [], "tokens": 0, "ok": 0, "errors": []}
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    def client(worker):
        rng = random.Random(seed * 1000 + worker)
        index = worker
        while time.monotonic() < deadline:
            path, body = request_body(index, max_tokens, rng)
            index += concurrency
            try:
                latency, ttft, tokens = stream_once(port, path, body, timeout_s)
                with lock:
                    results["latency"].append(latency)
                    results["ttft"].append(ttft)
                    results["tokens"] += tokens
                    results["ok"] += 1
            except RequestFailed as error:
                with lock:
                    results["errors"].append(str(error))

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results["wall_s"] = time.monotonic() - started
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True, help="the strata executable")
    parser.add_argument("--model", help="-m for strata serve (default: the embedded model)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10, help="seconds of measured load")
    parser.add_argument("--warmup", type=float, default=2, help="seconds of the same load before measuring")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120, help="per-request client timeout (s)")
    parser.add_argument("--rss-margin-mib", type=float, default=24,
                        help="allowed RSS growth from warm-up to the end (negative: report only)")
    parser.add_argument("--cache-ram-mib", type=float, default=16,
                        help="--cache-ram for the server, in MiB: every request leaves snapshots in the "
                             "conversation state cache, which may fill to this bound, so it is added to "
                             "the RSS margin")
    parser.add_argument("--server-args", default="",
                        help="more strata serve options, one string (e.g. \"--parallel 8\")")
    parser.add_argument("--rss-every", type=float, default=0,
                        help="also sample RSS (and the heap gauges of /metrics) every this many seconds of the measured run and print "
                             "the samples (0: only before and after)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", help="also write the numbers as JSON here")
    args = parser.parse_args()

    command = [args.binary, "serve", "--port", "0", "--quiet", "--max-queue", str(max(64, 2 * args.concurrency))]
    command += ["--cache-ram", f"{int(args.cache_ram_mib)}M"]
    if args.model:
        command += ["-m", args.model]
    command += shlex.split(args.server_args)
    server_log = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=server_log, text=True)
    status = 1
    try:
        line = server.stdout.readline()
        match = re.search(r" on http://[^ ]*:(\d+) ", line)
        if not match:
            server_log.seek(0)
            print(f"FAIL: strata serve did not start: {line!r}\n{server_log.read()}")
            return 1
        port = int(match.group(1))
        print(f"load: {args.concurrency} concurrent streams, {args.warmup:g} s warm-up + {args.duration:g} s "
              f"measured, max_tokens {args.max_tokens}, against {line.strip()}")

        warm = run_load(port, args.concurrency, args.warmup, args.max_tokens, args.timeout, args.seed + 7)
        rss_before = rss_mib(server.pid)
        rss_samples = []
        sampling_done = threading.Event()

        def sample_rss():
            started = time.monotonic()
            while not sampling_done.wait(args.rss_every):
                rss_samples.append((time.monotonic() - started, rss_mib(server.pid), *heap_mib(port)))

        sampler = threading.Thread(target=sample_rss)
        if args.rss_every > 0:
            sampler.start()
        result = run_load(port, args.concurrency, args.duration, args.max_tokens, args.timeout, args.seed)
        sampling_done.set()
        if args.rss_every > 0:
            sampler.join()
        time.sleep(0.5)
        rss_after = rss_mib(server.pid)
        trims = metric_values(port, ("strata_heap_trims_total", "strata_heap_trim_seconds_total"))

        errors = warm["errors"] + result["errors"]
        lat, ttft = result["latency"], result["ttft"]
        report = {
            "concurrency": args.concurrency, "duration_s": args.duration, "max_tokens": args.max_tokens,
            "requests_ok": result["ok"], "errors": len(errors), "warmup_requests_ok": warm["ok"],
            "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
            "latency_max_s": max(lat) if lat else float("nan"),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "completion_tokens": result["tokens"], "tokens_per_s": result["tokens"] / result["wall_s"],
            "requests_per_s": result["ok"] / result["wall_s"],
            "rss_before_mib": rss_before, "rss_after_mib": rss_after, "rss_margin_mib": args.rss_margin_mib,
        }
        print(f"requests: {result['ok']} ok, {len(errors)} errors ({warm['ok']} more in the warm-up); "
              f"{result['tokens']} tokens, {report['tokens_per_s']:.0f} tok/s, {report['requests_per_s']:.1f} req/s")
        print(f"latency (request sent -> [DONE]): p50 {report['latency_p50_s']:.3f} s, "
              f"p99 {report['latency_p99_s']:.3f} s, max {report['latency_max_s']:.3f} s")
        print(f"time to first token: p50 {report['ttft_p50_s']:.3f} s, p99 {report['ttft_p99_s']:.3f} s")
        margin = "report only" if args.rss_margin_mib < 0 else f"margin {args.rss_margin_mib:g} MiB"
        print(f"RSS: {rss_before:.1f} MiB after warm-up, {rss_after:.1f} MiB after the run "
              f"({rss_after - rss_before:+.1f} MiB; {margin})")
        if trims["strata_heap_trims_total"] > 0:
            print(f"malloc_trim: {trims['strata_heap_trims_total']:.0f} calls, "
                  f"{trims['strata_heap_trim_seconds_total'] * 1000:.1f} ms in all")
        if rss_samples:
            print("RSS samples (s: MiB): " + ", ".join(f"{t:.0f}: {m:.1f}" for t, m, _, _ in rss_samples))
            print("malloc arenas, in use / free (s: MiB): " +
                  ", ".join(f"{t:.0f}: {u:.1f}/{f:.1f}" for t, _, u, f in rss_samples))
            report["rss_samples_mib"] = [m for _, m, _, _ in rss_samples]
            report["heap_in_use_samples_mib"] = [u for _, _, u, _ in rss_samples]
            report["heap_free_samples_mib"] = [f for _, _, _, f in rss_samples]
        for error in errors[:10]:
            print(f"error: {error}")

        failed = False
        if errors:
            print(f"FAIL: {len(errors)} requests failed")
            server_log.seek(0)
            print("server stderr (last lines):\n" + "".join(server_log.readlines()[-20:]))
            failed = True
        if result["ok"] == 0:
            print("FAIL: no request completed")
            failed = True
        allowed = args.rss_margin_mib + int(args.cache_ram_mib)
        if args.rss_margin_mib >= 0 and rss_after - rss_before > allowed:
            print(f"FAIL: RSS grew by {rss_after - rss_before:.1f} MiB (> {args.rss_margin_mib:g} MiB "
                  f"+ {int(args.cache_ram_mib)} MiB of state cache)")
            failed = True

        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(timeout=60)
        report["server_exit_code"] = exit_code
        print(f"strata serve exited {exit_code} after SIGTERM")
        if exit_code != 0:
            server_log.seek(0)
            print(server_log.read()[-2000:])
            failed = True
        if args.json_out:
            with open(args.json_out, "w") as out:
                json.dump(report, out, indent=2)
        status = 1 if failed else 0
        print("PASS" if status == 0 else "FAIL")
        return status
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
