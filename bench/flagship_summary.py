#!/usr/bin/env python3
"""Summarizes bench/flagship_run.sh's OUT_DIR/run-*.json (strata run) and llama*.json (llama.cpp) into
the rows of docs/bench-experts.md's flagship table.  Usage: bench/flagship_summary.py OUT_DIR..."""
import glob
import json
import os
import re
import statistics
import sys


def interp(samples, t, key="read_bytes"):
    prev = None
    for s in samples:
        if s["t"] >= t:
            if prev is None:
                return s[key]
            f = (t - prev["t"]) / max(s["t"] - prev["t"], 1e-9)
            return prev[key] + f * (s[key] - prev[key])
        prev = s
    return samples[-1][key]


def strata_run(path):
    r = json.load(open(path))
    d = {"file": os.path.basename(path), "rc": r["rc"], "wall_s": r["wall_s"], "maxrss_gib": r["ru_maxrss_kib"] / 2**20,
         "load": r["load1_min_max"], "utc": r.get("utc_start")}
    for t, line in r["stderr"]:
        if "experts from" in line:
            d["store_open_s"] = t
            d["arena"] = re.search(r"\(([\d.]+ \w+) arena", line).group(1)
            d["slots"] = int(re.search(r"(\d+) slots/layer", line).group(1))
        elif " layers, " in line and "top-" in line:
            d["ready_s"] = t
        elif line.startswith("strata: prompt "):
            m = re.search(r"prompt (\d+) tokens in ([\d.]+) s .*generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s", line)
            d["prompt_tokens"], d["prefill_s"] = int(m.group(1)), float(m.group(2))
            d["generated"], d["decode_s"], d["tok_s"] = int(m.group(3)), float(m.group(4)), float(m.group(5))
            d["end_s"] = t
        elif line.startswith("strata: decode experts"):
            m = re.search(r"hit ([\d.]+)%.*?([\d.]+) misses/token\), read ([\d.]+ \w+) \(([\d.]+) MB/token, misses ([\d.]+)\).*I/O wait \d+ ms \(([\d.]+) ms/token", line)
            d["hit"], d["misses_per_token"], d["decode_read"] = float(m.group(1)), float(m.group(2)), m.group(3)
            d["mb_per_token"], d["miss_mb_per_token"], d["io_wait_ms"] = float(m.group(4)), float(m.group(5)), float(m.group(6))
        elif line.startswith("strata: profile per decoded token: ") and " ms = " in line:
            # not the "by part" line, nor the "pool hand-outs" line (printed since 239d9a10)
            d["token_ms"] = float(re.search(r"token: ([\d.]+) ms", line).group(1))
            d["fetch_ms"] = float(re.search(r"expert fetch ([\d.]+) ms", line).group(1))
    if "end_s" in d:
        d["ttft_s"] = d["ready_s"] + d["prefill_s"]
        # /proc/PID/io over the decode: all reads of the process (dense page faults included).
        t1 = d["end_s"]
        t0 = t1 - d["decode_s"]
        s = r["samples"]
        d["proc_decode_mb_per_token"] = (interp(s, t1) - interp(s, t0)) / 1e6 / max(d["generated"] - 1, 1)
        d["proc_startup_read_gb"] = interp(s, d["ready_s"]) / 1e9
        d["proc_ttft_read_gb"] = interp(s, d["ready_s"] + d["prefill_s"]) / 1e9
        d["total_read_gb"] = r["ru_inblock_512"] * 512 / 1e9
        d["compute_ceiling"] = 1000 / (d["token_ms"] - d["fetch_ms"]) if "token_ms" in d else None
    return d


def main():
    for out in sys.argv[1:]:
        print(f"## {out}")
        rows = [strata_run(p) for p in sorted(glob.glob(os.path.join(out, "run-*.json")))]
        for d in rows:
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}))
        by = {}
        for d in rows:
            by.setdefault(d["file"].split("-")[1], []).append(d)
        for budget, ds in by.items():
            med = lambda k: statistics.median([x[k] for x in ds if x.get(k) is not None])
            print(f"budget {budget}%: tok/s {med('tok_s'):.2f} ({', '.join('%.2f' % x['tok_s'] for x in ds)}), "
                  f"maxrss {med('maxrss_gib'):.2f} GiB, store open {med('store_open_s'):.2f} s, ready {med('ready_s'):.2f} s, "
                  f"TTFT {med('ttft_s'):.1f} s (prefill {med('prefill_s'):.1f} s), read before first token {med('proc_ttft_read_gb'):.2f} GB, "
                  f"hit {med('hit'):.1f}%, misses/token {med('misses_per_token'):.2f}, MB/token misses {med('miss_mb_per_token'):.2f} "
                  f"(store reads {med('mb_per_token'):.1f}, /proc/PID/io {med('proc_decode_mb_per_token'):.1f}), "
                  f"I/O wait {med('io_wait_ms'):.1f} ms/token, token {med('token_ms'):.0f} ms, compute ceiling {med('compute_ceiling'):.2f} tok/s, "
                  f"load {[x['load'] for x in ds]}")
        for p in sorted(glob.glob(os.path.join(out, "llama*.json"))):
            r = json.load(open(p))
            steps = []
            for t, line in r["stderr"]:
                if line.startswith("llama: "):
                    steps.append((t, json.loads(line[7:])))
                elif "run_with_memory_limit" in line or "CPU_REPACK" in line or "CPU_Mapped" in line or "GGML_ASSERT" in line:
                    print(f"  {os.path.basename(p)} [{t:.1f}] {line}")
            print(f"  {os.path.basename(p)}: rc {r['rc']}, wall {r['wall_s']:.0f} s, maxrss {r['ru_maxrss_kib'] / 2**20:.2f} GiB, "
                  f"killed_by_timeout {r['killed_by_timeout']}, read {r['ru_inblock_512'] * 512 / 1e9:.1f} GB, load {r['load1_min_max']}")
            for t, s in steps:
                print(f"    [{t:7.1f}] {s['what']:16s} read {s['read_bytes'] / 1e9:7.2f} GB rss {s['rss_bytes'] / 2**30:.2f} GiB "
                      f"{'step ' + str(s['step']) if 'step' in s else ''}")
            dec = [(t, s) for t, s in steps if s["what"] == "decode step"]
            pr = [(t, s) for t, s in steps if s["what"] == "prompt done"]
            if dec and pr:
                t_prev, s_prev = pr[0]
                n = len(dec)
                dt = dec[-1][0] - t_prev
                print(f"    decode: {n} tokens in {dt:.1f} s = {n / dt:.4f} tok/s, "
                      f"{(dec[-1][1]['read_bytes'] - s_prev['read_bytes']) / n / 1e9:.2f} GB read per token")


main()
