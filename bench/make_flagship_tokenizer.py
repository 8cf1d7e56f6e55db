#!/usr/bin/env python3
"""Writes OUT_DIR/tokenizer.json: tests/data/tokenizer's byte-level BPE grown to N ids (default
248320, the qwen3.8-flash-next shape's vocabulary), so that `strata synth --tokenizer OUT_DIR` keeps
the flagship's full embedding and output head AND llama.cpp accepts the file (it refuses a GGUF
without tokenizer.ggml.model; docs/bench-experts.md).  The test tokenizer's 3000 tokens, 2744 merges
and 7 special tokens are kept; new tokens are made by merges of existing tokens (two byte-level
characters, then three), each a valid merge whose parts are in the vocabulary.  The special tokens
move to the last ids.  What the tokens spell does not matter: the benches feed token ids.

Usage: bench/make_flagship_tokenizer.py OUT_DIR [--n 248320] [--base tests/data/tokenizer]
"""
import argparse
import json
import os

p = argparse.ArgumentParser()
p.add_argument("out_dir")
p.add_argument("--n", type=int, default=248320)
p.add_argument("--base", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tokenizer"))
a = p.parse_args()

j = json.load(open(os.path.join(a.base, "tokenizer.json")))
vocab = dict(j["model"]["vocab"])
merges = list(j["model"]["merges"])
added = j["added_tokens"]
n_model = a.n - len(added)
singles = sorted([t for t in vocab if len(t) == 1], key=lambda t: vocab[t])
next_id = max(vocab.values()) + 1


def add(left, right):
    global next_id
    s = left + right
    if s in vocab or next_id >= n_model:
        return
    vocab[s] = next_id
    next_id += 1
    merges.append([left, right])


for x in singles:
    for y in singles:
        add(x, y)
pairs = [x + y for x in singles for y in singles]
for xy in pairs:
    if next_id >= n_model:
        break
    if xy not in vocab:
        continue
    for z in singles:
        add(xy, z)
assert next_id == n_model, (next_id, n_model)
for i, t in enumerate(added):
    t["id"] = n_model + i
j["model"]["vocab"] = vocab
j["model"]["merges"] = merges
os.makedirs(a.out_dir, exist_ok=True)
with open(os.path.join(a.out_dir, "tokenizer.json"), "w") as f:
    json.dump(j, f, ensure_ascii=False)
for name in os.listdir(a.base):  # tokenizer_config.json etc., when present
    if name != "tokenizer.json" and name.endswith(".json") and name.startswith("tokenizer"):
        with open(os.path.join(a.base, name)) as src, open(os.path.join(a.out_dir, name), "w") as dst:
            dst.write(src.read())
print(f"{a.out_dir}/tokenizer.json: {len(vocab)} model tokens + {len(added)} special = {len(vocab) + len(added)} ids, "
      f"{len(merges)} merges")
