#!/usr/bin/env python3
"""Builds the training corpus of strata's embedded default model from freely licensed text on a Debian 12 box.

Runs on the dev box (no network beyond Debian's archive). Needs these Debian packages:
    apt-get install -y bible-kjv bible-kjv-text fortunes fortunes-min groff-base man-db python3
Sources (licences in docs/default-model.md):
    kjv       the King James Bible (public domain), via the `bible` program of bible-kjv; one document per chapter
    fortunes  /usr/share/games/fortunes/* (fortunes, fortunes-min; BSD fortune-mod data); ~2 KB documents
    man       man pages of sections 1-8 rendered to plain text by groff (-Tutf8, 80 columns), sampled by hash
    python    the Python 3.11 standard library sources in /usr/lib/python3.11 (PSF licence), tests excluded
    licences  /usr/share/common-licenses/* and README files under /usr/share/doc (Debian main, DFSG-free)

Output (default .train/): corpus.jsonl.xz — one JSON object per document {"src", "name", "split", "text"},
documents in a fixed order; split is "heldout" for about 2% of each source's documents (sha1 of src/name mod 50
== 0) and "train" otherwise — and corpus_manifest.json with per-source document/byte counts and the sha256 of
the archive. Deterministic for a given set of installed packages (sorted walks, hash-based sampling).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HELDOUT_MODULUS = 50
MAN_BUDGET_BYTES = 9_000_000
PYTHON_BUDGET_BYTES = 11_000_000
DOC_BUDGET_BYTES = 1_500_000
FORTUNE_DOC_BYTES = 2000


def digest(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16)


def split_of(src: str, name: str) -> str:
    return "heldout" if digest(f"{src}/{name}") % HELDOUT_MODULUS == 0 else "train"


def clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\x00", "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"


def kjv_documents():
    out = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters = re.split(r"\n\n(?=(?:[1-3] )?[A-Z][A-Za-z ]+ \d+\n)", "\n" + out)
    for chapter in chapters:
        chapter = chapter.strip("\n")
        if not chapter:
            continue
        title = chapter.split("\n", 1)[0]
        body = re.sub(r"^ +(\d+) ", r"\1 ", chapter, flags=re.M)
        yield title, body + "\n"


def fortune_documents():
    root = Path("/usr/share/games/fortunes")
    for path in sorted(root.iterdir()):
        if path.suffix in (".dat", ".u8") or path.is_dir() or path.is_symlink():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        items = [item.strip("\n") for item in re.split(r"^%$", text, flags=re.M) if item.strip()]
        group, size, part = [], 0, 0
        for item in items:
            group.append(item)
            size += len(item)
            if size >= FORTUNE_DOC_BYTES:
                yield f"{path.name}#{part}", "\n\n".join(group) + "\n"
                group, size, part = [], 0, part + 1
        if group:
            yield f"{path.name}#{part}", "\n\n".join(group) + "\n"


def render_man(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if raw.startswith(b".so "):  # a link to another page
        return ""
    result = subprocess.run(["groff", "-man", "-Tutf8", "-P", "-cbou", "-rLL=80n", "-rcR=1"], input=raw,
                            capture_output=True, timeout=60)
    return result.stdout.decode("utf-8", errors="replace")


def man_documents(budget: int):
    pages = []
    for section in range(1, 9):
        folder = Path(f"/usr/share/man/man{section}")
        if folder.is_dir():
            pages += [p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()]
    pages.sort(key=lambda p: digest(p.name))  # a fixed pseudo-random order, independent of the walk
    total, batch = 0, 64
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        for start in range(0, len(pages), batch):
            chunk = pages[start: start + batch]
            for path, text in zip(chunk, pool.map(render_man, chunk)):
                if len(text) < 400 or len(text) > 200_000:
                    continue
                yield path.name, text
                total += len(text.encode())
                if total >= budget:
                    return


def python_documents(budget: int):
    root = Path("/usr/lib/python3.11")
    skip = re.compile(r"(^|/)(test|tests|idle_test|site-packages|dist-packages|__pycache__|lib2to3/tests)(/|$)")
    files = [p for p in sorted(root.rglob("*.py")) if not skip.search(str(p.relative_to(root)))]
    files.sort(key=lambda p: digest(str(p.relative_to(root))))
    total = 0
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if len(text) < 200 or len(text) > 300_000:
            continue
        yield str(path.relative_to(root)), text
        total += len(text.encode())
        if total >= budget:
            return


def licence_documents(budget: int):
    total = 0
    for path in sorted(Path("/usr/share/common-licenses").iterdir()):
        if path.is_file() and not path.is_symlink():
            text = path.read_text(errors="replace")
            total += len(text.encode())
            yield f"common-licenses/{path.name}", text
    readmes = sorted(p for p in Path("/usr/share/doc").rglob("README*") if p.is_file() and not p.is_symlink())
    for path in readmes:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8", errors="replace")
        if len(text) < 500 or len(text) > 100_000 or "\ufffd" in text:
            continue
        yield str(path.relative_to("/usr/share/doc")), text
        total += len(text.encode())
        if total >= budget:
            return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / ".train")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sources = [("kjv", kjv_documents()), ("fortunes", fortune_documents()),
               ("licences", licence_documents(DOC_BUDGET_BYTES)), ("python", python_documents(PYTHON_BUDGET_BYTES)),
               ("man", man_documents(MAN_BUDGET_BYTES))]
    archive = args.out / "corpus.jsonl.xz"
    stats = {}
    with lzma.open(archive, "wt", encoding="utf-8", preset=6) as sink:
        for src, documents in sources:
            started = time.time()
            entry = stats.setdefault(src, {"train_docs": 0, "heldout_docs": 0, "train_bytes": 0, "heldout_bytes": 0})
            for name, text in documents:
                text = clean(text)
                if "<|" in text:  # never let corpus text spell a control token
                    text = text.replace("<|", "< |")
                split = split_of(src, name)
                entry[f"{split}_docs"] += 1
                entry[f"{split}_bytes"] += len(text.encode())
                sink.write(json.dumps({"src": src, "name": name, "split": split, "text": text},
                                      ensure_ascii=False) + "\n")
            print(f"{src}: {entry} ({time.time() - started:.0f} s)", flush=True)
    manifest = {"archive": archive.name, "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
                "archive_bytes": archive.stat().st_size, "sources": stats,
                "total_bytes": sum(e["train_bytes"] + e["heldout_bytes"] for e in stats.values()),
                "heldout_rule": f"sha1('src/name')[:12] mod {HELDOUT_MODULUS} == 0"}
    (args.out / "corpus_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
