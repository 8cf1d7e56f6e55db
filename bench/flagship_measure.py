#!/usr/bin/env python3
"""Runs one command from a cold page cache and records what docs/bench-experts.md's flagship section
("The flagship at full scale (issue 16 item 5)") reports for it.

Usage: bench/flagship_measure.py --out RUN.json [--no-drop] [--sample-s 0.25] -- command args...

  1. sync; echo 3 > /proc/sys/vm/drop_caches (unless --no-drop; fails loudly if it cannot).
  2. Starts the command; every line it writes to stderr is kept with its time since the start
     (so "startup" = the time of strata's "experts from ..." / "N layers ..." lines, and llama.cpp's
     per-token lines from flagship_llama_decode.mjs can be placed in time).
  3. Every --sample-s seconds: the command's /proc/PID/io (read_bytes, all threads), its VmRSS and
     VmHWM, the disk's sectors read (/sys/block/DEV/stat, whole machine) and /proc/loadavg.
  4. At the end: exit status, wall time, ru_maxrss of the child (what /usr/bin/time -v reports as
     "Maximum resident set size"), user/sys CPU seconds, and the samples.
Writes one JSON object to --out and prints a short summary line on stdout. stdout of the command is
kept in the JSON too (strata --print-ids writes the ids there).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def read_kv(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def disk_sectors_read(dev):
    try:
        with open(f"/sys/block/{dev}/stat") as f:
            return int(f.read().split()[2])
    except OSError:
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--no-drop", action="store_true")
    p.add_argument("--sample-s", type=float, default=0.25)
    p.add_argument("--dev", default="vda")
    p.add_argument("--timeout", type=float, default=0,
                   help="SIGTERM the command's process group after this many seconds, SIGKILL 15 s later (0: none)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        sys.exit("flagship_measure: no command")
    drop = None
    if not a.no_drop:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        drop = "sync; echo 3 > /proc/sys/vm/drop_caches"
    mem_before = read_kv("/proc/meminfo")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True)  # its own process group: a timeout reaches every child
    lines, out_lines = [], []

    def pump_err():
        for line in proc.stderr:
            t = time.monotonic() - t0
            lines.append([round(t, 3), line.rstrip("\n")])
            sys.stderr.write(f"[{t:8.2f}] {line}")
            sys.stderr.flush()

    def pump_out():
        for line in proc.stdout:
            out_lines.append(line.rstrip("\n"))

    te = threading.Thread(target=pump_err, daemon=True)
    to = threading.Thread(target=pump_out, daemon=True)
    te.start()
    to.start()
    samples = []
    status = rusage = None
    killed = False
    while True:
        t = time.monotonic() - t0
        io = read_kv(f"/proc/{proc.pid}/io")
        st = read_kv(f"/proc/{proc.pid}/status")
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        if io:
            samples.append({
                "t": round(t, 3), "read_bytes": int(io.get("read_bytes", 0)), "rchar": int(io.get("rchar", 0)),
                "vmrss_kb": int(st.get("VmRSS", "0 kB").split()[0]), "vmhwm_kb": int(st.get("VmHWM", "0 kB").split()[0]),
                "disk_sectors_read": disk_sectors_read(a.dev), "load1": float(load)})
        pid, wstatus, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            status, rusage = wstatus, ru
            break
        if a.timeout and t > a.timeout and not killed:
            os.killpg(proc.pid, signal.SIGTERM)
            killed = t
        elif killed and t > killed + 15:  # node-llama-cpp ignored SIGTERM while loading: escalate
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(a.sample_s)
    wall = time.monotonic() - t0
    te.join(2)
    to.join(2)
    rc = os.waitstatus_to_exitcode(status)
    result = {
        "cmd": cmd, "drop_caches": drop, "rc": rc, "killed_by_timeout": bool(killed), "wall_s": round(wall, 3),
        "ru_maxrss_kib": rusage.ru_maxrss, "user_s": rusage.ru_utime, "sys_s": rusage.ru_stime,
        "ru_inblock_512": rusage.ru_inblock, "ru_majflt": rusage.ru_majflt,
        "mem_available_before_kb": mem_before.get("MemAvailable"),
        "stderr": lines, "stdout": out_lines, "samples": samples,
        "load1_min_max": [min(s["load1"] for s in samples), max(s["load1"] for s in samples)] if samples else None,
        "utc_start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - wall)),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    last = samples[-1] if samples else {}
    print(f"rc {rc} wall {wall:.1f} s maxrss {rusage.ru_maxrss / 1048576:.2f} GiB "
          f"read {last.get('read_bytes', 0) / 1e9:.2f} GB load {result['load1_min_max']}")
    sys.exit(0)


if __name__ == "__main__":
    main()
