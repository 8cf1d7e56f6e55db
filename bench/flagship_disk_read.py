#!/usr/bin/env python3
"""The disk's read bandwidth for the flagship's miss pattern, independent of strata: O_DIRECT reads of
expert-sized slices at random 4 KiB-aligned offsets of FILE (the expert tensors fill all but the first
~2 GiB and the dense tensors between layers), from T threads at once (strata's 4 I/O threads), for
--seconds each configuration.  The flagship's IQ2_XS expert is three slices: gate and up 2560x640
IQ2_XS (473,600 B each) and down 640x2560 IQ4_NL (921,600 B), about 1.87 MB; each read here is one
slice rounded out to 4 KiB.  Prints GB/s per configuration; --json keeps them.

Usage: bench/flagship_disk_read.py FILE [--seconds 20] [--threads 1,4,8] [--json OUT]
"""
import argparse
import json
import mmap
import os
import random
import threading
import time

SLICES = [473600, 473600, 921600]

p = argparse.ArgumentParser()
p.add_argument("file")
p.add_argument("--seconds", type=float, default=20)
p.add_argument("--threads", default="1,4,8")
p.add_argument("--json")
a = p.parse_args()
size = os.path.getsize(a.file)
lo = 2 << 30
results = {}
for nt in [int(x) for x in a.threads.split(",")]:
    per = a.seconds / len(a.threads.split(","))
    total = [0] * nt
    count = [0] * nt
    stop = time.monotonic() + per

    def worker(i):
        fd = os.open(a.file, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 1 << 20)
        rng = random.Random(1000 + i)
        try:
            while time.monotonic() < stop:
                for s in SLICES:
                    n = (s + 4096 + 4095) // 4096 * 4096  # a slice at an arbitrary offset spans one block more
                    off = rng.randrange(lo, size - n) // 4096 * 4096
                    got = os.preadv(fd, [memoryview(buf)[:n]], off)
                    total[i] += got
                    count[i] += 1
        finally:
            os.close(fd)

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nt)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    results[nt] = {"threads": nt, "seconds": round(dt, 2), "bytes": sum(total), "reads": sum(count),
                   "gb_per_s": round(sum(total) / dt / 1e9, 3), "load1": os.getloadavg()[0]}
    print(f"O_DIRECT random expert slices, {nt} thread(s): {sum(total) / dt / 1e9:.2f} GB/s "
          f"({sum(count)} reads in {dt:.1f} s, load {os.getloadavg()[0]:.1f})", flush=True)
if a.json:
    with open(a.json, "w") as f:
        json.dump({"file": a.file, "file_bytes": size, "results": list(results.values())}, f, indent=1)
