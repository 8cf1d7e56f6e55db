#!/usr/bin/env python3
"""Trains strata's embedded default model: a small qwen4exp (hyper-connections, Gated DeltaNet + QSA 3:1, 64-expert
MoE with a shared expert, PLE n-gram table) with a jointly trained MTP head, on freely licensed Debian text.

One command does everything on the H200 box (docs/default-model.md has the exact invocation):
  1. reads the corpus (tools/build_corpus.py, .train/corpus.jsonl.xz) and trains a byte-level BPE with Hugging Face
     `tokenizers` (Qwen3.5 split regex, NFC, ByteLevel; vocab 6144 incl. <|endoftext|> <|im_start|> <|im_end|>);
  2. rehearses the export on a randomised copy of the model (save_pretrained + from_pretrained + logits parity
     with transformers' Qwen4ExpForCausalLM), so a naming or math mismatch fails within the first minute;
  3. trains the module of tools/qwen4exp_torch.py in bf16 autocast until the time budget (LM loss + 0.3 x MTP
     next-next-token loss + 0.01 x load balance + 0.1 x QSA indexer KL), keeping the best validation checkpoint;
  4. evaluates on held-out text (perplexity, MTP acceptance, expert-usage skew), exports HF format in bf16 with
     the `mtp.*` tensors, checks parity again on the trained weights and writes everything under --out as
     model.tar.partNN (<= 15 MiB each) plus metrics.json.
`selftest` runs a tiny configuration on the CPU without `tokenizers`/`transformers` (byte tokens) and writes a
saved-format checkpoint with its reference logits, for checking strata on the dev box. `fixture-check` compares the
module with transformers' reference outputs of tests/data/models/qwen4exp (needs only torch and numpy);
`strata-ppl` measures the test perplexity of GGUF files through `strata run --logits-out`.
"""
from __future__ import annotations

import argparse
import copy
import json
import lzma
import math
import os
import shutil
import sys
import tarfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import default_model_checks as checks  # noqa: E402
import qwen4exp_io as qio  # noqa: E402
from qwen4exp_torch import Qwen4ExpTrainModel  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2; <|endoftext|> separates documents
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LOSS_WEIGHTS = {"mtp": 0.3, "balance": 0.01, "indexer_kl": 0.1}
PARITY_TOLERANCE = 1e-3
START = time.time()


def log(message: str) -> None:
    print(f"[{time.time() - START:7.1f}s] {message}", flush=True)


def tiny_shape(vocab: int) -> qio.Qwen4ExpShape:
    return qio.Qwen4ExpShape(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, mrope_section=[2, 1, 1], linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                             num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, hc_lowrank=16, ple_embed_dim=64,
                             ngram_vocab_size_base=500, make_ngram_vocab_size_divisible_by=8, indexer_head_dim=16,
                             indexer_budget=8)


# ------------------------------------------------------------------------------------------------------------
# Data


def load_corpus(path: Path) -> dict:
    docs = {"train": [], "heldout": []}
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            docs[doc["split"]].append(doc)
    # held-out documents alternate between validation (checkpoint choice) and test (reported numbers)
    docs["val"] = docs["heldout"][0::2]
    docs["test"] = docs["heldout"][1::2]
    return docs


def train_tokenizer(texts: list, vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"tokenizer: {t} has id {tok.token_to_id(t)}, expected {i}")
    return tok


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
            "model_max_length": 4096, "clean_up_tokenization_spaces": False}


class ByteTokenizer:
    """Stand-in for the selftest (no `tokenizers` needed): id = byte + 3; ids 0..2 are the special tokens."""

    def encode_all(self, texts):
        return [[b + 3 for b in t.encode()] for t in texts]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


def encode_stream(encode_all, docs: list, eos: int) -> tuple:
    ids = encode_all([d["text"] for d in docs])
    flat = []
    for piece in ids:
        flat.extend(piece)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long), sum(len(d["text"].encode()) for d in docs)


# ------------------------------------------------------------------------------------------------------------
# Training


def param_groups(model, weight_decay: float):
    decay, plain = [], []
    for name, p in model.named_parameters():
        small = p.ndim < 2 or "norm" in name or name.endswith(("A_log", "dt_bias")) or "conv1d" in name
        (plain if small else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def train_step(model, batch, autocast: bool) -> dict:
    seq = batch.shape[1] - 2
    x, nxt, nxt2 = batch[:, :seq], batch[:, 1: seq + 1], batch[:, 2: seq + 2]
    aux = {"balance": []}
    with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=autocast):
        pre, logits = model.trunk(x, aux, indexer_loss=True)
        draft = model.mtp_logits(pre, nxt, aux, indexer_loss=True)
    lm = F.cross_entropy(logits.float().flatten(0, 1), nxt.flatten())
    mtp = F.cross_entropy(draft.float().flatten(0, 1), nxt2.flatten())
    balance = torch.stack(aux["balance"]).mean()
    kl = torch.stack(aux["indexer_kl"]).mean() if aux.get("indexer_kl") else lm.new_zeros(())
    loss = lm + LOSS_WEIGHTS["mtp"] * mtp + LOSS_WEIGHTS["balance"] * balance + LOSS_WEIGHTS["indexer_kl"] * kl
    loss.backward()
    return {"loss": loss.detach(), "lm": lm.detach(), "mtp": mtp.detach(), "balance": balance.detach(),
            "indexer_kl": kl.detach()}


def train(model, stream, val_stream, args, deadline: float, device) -> dict:
    opt_kwargs = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kwargs)
    seq, batch = args.seq_len, args.batch
    stream = stream.to(device)
    gen = torch.Generator(device=device).manual_seed(1234)
    span = torch.arange(seq + 2, device=device)
    began, step, last_val = time.time(), 0, time.time()
    best = {"val_nll": float("inf"), "step": 0, "state": None}
    history, sums, count = [], {}, 0
    while True:
        now = time.time()
        frac = min(1.0, (now - began) / max(1.0, deadline - began))
        if now >= deadline or (args.max_steps and step >= args.max_steps):
            break
        warm = min(1.0, (step + 1) / args.warmup)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        offsets = torch.randint(0, stream.numel() - seq - 2, (batch,), device=device, generator=gen)
        try:
            stats = train_step(model, stream[offsets[:, None] + span], args.autocast)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        except Exception:  # noqa: BLE001 - keep what was learnt so far (best checkpoint below)
            if step == 0:
                raise
            log(f"training step {step + 1} FAILED, stopping:\n{traceback.format_exc()}")
            break
        opt.zero_grad(set_to_none=True)
        step += 1
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v
        count += 1
        if step % args.log_every == 0 or step == 1:
            means = {k: float(v) / count for k, v in sums.items()}
            sums, count = {}, 0
            if not math.isfinite(means["loss"]):
                log(f"training diverged at step {step}: {means}; stopping")
                break
            elapsed = time.time() - began
            rate = step * batch * seq / elapsed
            log(f"step {step} lr {lr:.2e} " + " ".join(f"{k} {v:.4f}" for k, v in means.items())
                + f" | {rate / 1e3:.0f}k tok/s, {elapsed:.0f}s")
            history.append({"step": step, "elapsed_s": round(elapsed, 1), **{k: round(v, 5) for k, v in means.items()}})
        if time.time() - last_val >= args.val_every or time.time() >= deadline:
            val = checks.evaluate(model, val_stream, seq, 32, limit=args.val_windows, autocast=args.autocast)
            last_val = time.time()
            log(f"  val nll {val['nll']:.4f} ppl {val['ppl']:.2f} mtp_top1 {val.get('mtp_top1_vs_true_next_next', 0):.3f}")
            if val["nll"] < best["val_nll"]:
                best = {"val_nll": val["nll"], "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    val = checks.evaluate(model, val_stream, seq, 32, limit=args.val_windows, autocast=args.autocast)
    log(f"end of training: step {step}, val nll {val['nll']:.4f} (best {best['val_nll']:.4f} at step {best['step']})")
    if not val["nll"] <= best["val_nll"] and best["state"] is not None:  # also when val["nll"] is NaN
        model.load_state_dict(best["state"])
        log(f"  restored the best checkpoint (step {best['step']})")
        chosen = best["step"]
    else:
        chosen = step
    return {"steps": step, "tokens_seen": step * batch * seq, "train_seconds": round(time.time() - began, 1),
            "chosen_step": chosen, "history": history}


@torch.no_grad()
def round_to_bf16(model) -> None:
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def randomise_for_rehearsal(model) -> None:
    """Makes every zero/identity-initialised tensor non-trivial, so the parity rehearsal checks every term."""
    gen = torch.Generator().manual_seed(7)
    for name, p in model.named_parameters():
        if "norm" in name or name.endswith("ple.conv1d.weight"):
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)


def rehearse(model, stream, out_dir: Path) -> dict:
    """Export + reload + parity on a randomised CPU copy, before any training. A failure is reported loudly but
    does not stop the run: the module's math is checked against transformers' fixture logits on the dev box, so
    the trained weights stay usable, and the final export falls back to our own writer of the same layout."""
    began = time.time()
    try:
        clone = copy.deepcopy(model).cpu().float()
        randomise_for_rehearsal(clone)
        round_to_bf16(clone)
        info = checks.export_hf(clone, out_dir)
        ids = stream[: 2 * 97].view(2, 97).clone()
        report = checks.parity(clone, out_dir, ids, PARITY_TOLERANCE)
        reread = Qwen4ExpTrainModel(clone.shape)
        qio.load_saved_checkpoint(reread, qio.st_load(out_dir / "model.safetensors"))
        same = all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), reread.state_dict().values()))
        report.update({"export": info, "saved_checkpoint_roundtrip_identical": same})
        report["ok"] = report["ok"] and same
    except Exception:  # noqa: BLE001
        report = {"ok": False, "error": traceback.format_exc()}
    report["seconds"] = time.time() - began
    log(f"rehearsal{'' if report['ok'] else ' FAILED (training anyway)'}: {json.dumps(report, default=str)}")
    shutil.rmtree(out_dir, ignore_errors=True)
    return report


# ------------------------------------------------------------------------------------------------------------
# Commands


def cmd_train(args) -> int:
    import tokenizers
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
        f"cuda {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: `train` is meant for the H200 box (use `selftest` on a CPU)")
    device = torch.device("cuda")
    torch.manual_seed(1234)
    deadline_total = START + args.time_budget
    docs = load_corpus(args.corpus)
    log(f"corpus: {len(docs['train'])} train docs, {len(docs['val'])} val, {len(docs['test'])} test")
    work = args.work or args.out / "pack"
    hf_dir = work / "hf"
    work.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer([d["text"] for d in docs["train"]], args.vocab)
    log(f"tokenizer: vocab {tok.get_vocab_size()}")
    fast = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode_all(texts):
        return [e.ids for e in fast(texts, add_special_tokens=False)]

    streams = {split: encode_stream(encode_all, docs[split], 0) for split in ("train", "val", "test")}
    for split, (ids, nbytes) in streams.items():
        log(f"  {split}: {ids.numel()} tokens, {nbytes} bytes, {nbytes / ids.numel():.2f} bytes/token")
    shape = qio.Qwen4ExpShape(vocab_size=tok.get_vocab_size())
    model = Qwen4ExpTrainModel(shape)
    n_params = sum(p.numel() for p in model.parameters())
    n_experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_experts / 1e6:.2f}M in routed experts)")
    rehearsal = rehearse(model, streams["train"][0], work / "rehearsal")
    model.to(device)
    reserve = min(150.0, max(100.0, 2.5 * rehearsal["seconds"] + 60.0))
    deadline = deadline_total - reserve
    log(f"training until {deadline - START:.0f}s (reserve {reserve:.0f}s for evaluation and export)")
    run = train(model, streams["train"][0], streams["val"][0], args, deadline, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.float()
    round_to_bf16(model)  # the shipped weights are bf16: report the numbers of exactly those
    test_ids, test_bytes = streams["test"]
    metrics = {"shape": shape.hf_config_kwargs(), "params": n_params, "routed_expert_params": n_experts,
               "tokenizer_vocab": tok.get_vocab_size(), "corpus_tokens": {k: v[0].numel() for k, v in streams.items()},
               "loss_weights": LOSS_WEIGHTS, "train": {k: v for k, v in run.items() if k != "history"},
               "history": run["history"], "rehearsal": rehearsal}
    metrics["errors"] = []

    def guarded(stage: str, fn):
        """A failing metric must not cost the checkpoint: log it, record it, go on to export and pack."""
        try:
            return fn()
        except Exception:  # noqa: BLE001
            log(f"{stage} FAILED:\n{traceback.format_exc()}")
            metrics["errors"].append({"stage": stage, "error": traceback.format_exc(limit=3)})
            return None

    def test_metrics():
        test = checks.evaluate(model, test_ids, args.seq_len, 16)
        test["bits_per_byte"] = test["nll"] / math.log(2) * test_ids.numel() / test_bytes  # tokens/byte of the text
        log(f"test: {json.dumps({k: v for k, v in test.items() if k != 'experts'})}")
        log(f"expert skew: mean top-10% mass share {test['experts']['mean_top10pct_mass_share']:.3f} "
            f"(uniform {test['experts']['uniform_share_of_top_n']:.3f})")
        return test

    metrics["test"] = guarded("test metrics", test_metrics)
    prompts = checks.windows(test_ids, 64, 32).to(device)
    metrics["speculative"] = guarded("speculative", lambda: checks.speculative_acceptance(model, prompts, 48))
    log(f"speculative greedy acceptance: {metrics['speculative']}")
    model.cpu()
    metrics["export"] = guarded("export", lambda: checks.export_hf(model, hf_dir))
    if metrics["export"] is None:  # fall back to our own writer of the same layout (checked on the fixture)
        shutil.rmtree(hf_dir, ignore_errors=True)
        hf_dir.mkdir(parents=True)
        qio.st_save(qio.saved_format_tensors(model), hf_dir / "model.safetensors")
        (hf_dir / "config.json").write_text(json.dumps(shape.hf_config_json(), indent=2, sort_keys=True) + "\n")
    tok.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    parity_ids = checks.windows(test_ids, 161, 2).clone()
    metrics["parity"] = guarded("parity", lambda: checks.parity(model, hf_dir, parity_ids, PARITY_TOLERANCE))
    log(f"parity: {json.dumps(metrics['parity'])}")
    prompt = test_ids[1000:1064].tolist()
    ref = guarded("hf greedy", lambda: checks.hf_greedy(hf_dir, prompt, 32))
    if ref is not None:
        (work / "ref_prefill_logits.f32").write_bytes(ref["prefill_logits"].float().numpy().astype("<f4").tobytes())
        metrics["strata_reference"] = {"prompt": prompt, "hf_greedy": ref["greedy"],
                                       "prompt_text": tok.decode(prompt), "greedy_text": tok.decode(ref["greedy"])}
        log(f"sample (HF greedy): {tok.decode(prompt)!r} -> {tok.decode(ref['greedy'])!r}")
    metrics["elapsed_s"] = round(time.time() - START, 1)
    (work / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str) + "\n")
    shutil.copy(work / "metrics.json", args.out / "metrics.json")
    pack(work, args.out)
    ok = bool(metrics["parity"] and metrics["parity"]["ok"]) and not metrics["errors"]
    log("done" if ok else "FAILED somewhere (see above); files written anyway")
    return 0 if ok else 3


def pack(work: Path, out: Path, part_bytes: int = 15 * 1024 * 1024) -> None:
    tar_path = out / "pack.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(work, arcname="strata-default")
    data = tar_path.read_bytes()
    tar_path.unlink()
    for i in range(0, len(data), part_bytes):
        (out / f"model.tar.part{i // part_bytes:02d}").write_bytes(data[i: i + part_bytes])
    log(f"packed {len(data) / 1e6:.1f} MB into {math.ceil(len(data) / part_bytes)} parts")


def cmd_selftest(args) -> int:
    torch.manual_seed(1234)
    docs = load_corpus(args.corpus)
    byte_tok = ByteTokenizer()
    train_ids, _ = encode_stream(byte_tok.encode_all, docs["train"][:40], 0)
    if args.max_steps == 0:
        args.max_steps = 8
    val_ids, _ = encode_stream(byte_tok.encode_all, docs["val"][:6], 0)
    model = Qwen4ExpTrainModel(tiny_shape(320))
    log(f"tiny model: {sum(p.numel() for p in model.parameters())} parameters")
    torch.set_flush_denormal(True)
    args.seq_len, args.batch, args.warmup, args.val_every, args.val_windows = 64, 4, 2, 1e9, 2
    run = train(model, train_ids, val_ids, args, time.time() + 600, torch.device("cpu"))
    first, last = run["history"][0]["lm"], run["history"][-1]["lm"]
    log(f"lm loss {first:.3f} -> {last:.3f} over {run['steps']} steps")
    if not last < first:
        raise RuntimeError("selftest: the loss did not go down")
    round_to_bf16(model)
    report = checks.evaluate(model, val_ids, 64, 4, limit=8)
    log(f"eval: {json.dumps({k: v for k, v in report.items() if k != 'experts'})}")
    log(f"speculative: {checks.speculative_acceptance(model, checks.windows(val_ids, 32, 3), 8)}")
    out = args.out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    qio.st_save(qio.saved_format_tensors(model), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(model.shape.hf_config_json(), indent=2, sort_keys=True) + "\n")
    reread = Qwen4ExpTrainModel(model.shape)
    qio.load_saved_checkpoint(reread, qio.st_load(out / "model.safetensors"))
    prompt = val_ids[:48].clone()
    with torch.no_grad():
        pre, logits = model.trunk(prompt[None], {}, exact_selection=True)
        _, logits2 = reread.trunk(prompt[None], {}, exact_selection=True)
        draft = model.mtp_logits(pre, torch.cat([prompt[1:], logits[0, -1:].argmax(-1)])[None], {},
                                 exact_selection=True)
    if not torch.equal(logits, logits2):
        raise RuntimeError("selftest: the saved checkpoint does not reproduce the module")
    (args.out / "prompt_ids.txt").write_text(",".join(str(int(t)) for t in prompt) + "\n")
    (args.out / "prefill_logits.f32").write_bytes(logits[0].numpy().astype("<f4").tobytes())
    (args.out / "mtp_logits.f32").write_bytes(draft[0].numpy().astype("<f4").tobytes())
    log(f"wrote {out} and reference logits for prompt {prompt.tolist()[:8]}...")
    return 0


def cmd_fixture_check(args) -> int:
    """The module against transformers' reference outputs of the committed qwen4exp fixture (random weights)."""
    import numpy as np

    torch.set_flush_denormal(True)
    root = args.fixture
    shape = qio.Qwen4ExpShape.from_hf_config(json.loads((root / "hf/config.json").read_text()))
    model = Qwen4ExpTrainModel(shape).eval()
    qio.load_saved_checkpoint(model, qio.st_load(root / "hf/model.safetensors"))
    manifest = json.loads((root / "ref/manifest.json").read_text())

    def ref(name, rows):
        return torch.from_numpy(np.fromfile(root / "ref" / name, dtype="<f4").reshape(rows, -1))

    worst = 0.0
    with torch.no_grad():
        for i, prompt in enumerate(manifest["prompts"]):
            ids = torch.tensor([prompt["ids"]])
            pre, logits = model.trunk(ids, {}, exact_selection=True)
            diff = float((logits[0] - ref(f"prefill_logits_p{i}.bin", ids.shape[1])).abs().max())
            log(f"prompt {i}: prefill logits max |diff| {diff:.3g}")
            worst = max(worst, diff)
            if i == 0:
                diff = float((pre[0] - ref("trunk_premixer_p0.bin", ids.shape[1])).abs().max())
                draft = model.mtp_logits(pre, torch.tensor([manifest["mtp"]["next_tokens"]]), {}, exact_selection=True)
                mtp = float((draft[0] - ref("mtp_draft_logits_p0.bin", ids.shape[1])).abs().max())
                log(f"prompt 0: pre-mixer residual max |diff| {diff:.3g}, MTP draft logits max |diff| {mtp:.3g}")
                worst = max(worst, diff, mtp)
    log(f"worst {worst:.3g} ({'ok' if worst < 1e-4 else 'FAILED'}, tolerance 1e-4)")
    return 0 if worst < 1e-4 else 1


def bpe_encoder(tokenizer_json: Path):
    """A small re-implementation of the trained tokenizer's encode (NFC, Qwen3.5 split, byte-level BPE by merge
    rank), for machines without `tokenizers`; needs the `regex` module (Debian python3-regex)."""
    import unicodedata

    import regex

    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    ranks = {tuple(m.split(" ") if isinstance(m, str) else m): i for i, m in enumerate(spec["model"]["merges"])}
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in printable]
    byte_char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(extra)}
    pattern = regex.compile(QWEN35_REGEX)

    def bpe(piece: str) -> list:
        parts = [byte_char[b] for b in piece.encode()]
        while len(parts) > 1:
            rank, at = min((ranks.get(pair, 1 << 30), i) for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == 1 << 30:
                break
            parts[at: at + 2] = [parts[at] + parts[at + 1]]
        return [vocab[p] for p in parts]

    return lambda text: [t for piece in pattern.findall(unicodedata.normalize("NFC", text)) for t in bpe(piece)]


def cmd_strata_ppl(args) -> int:
    """Test-set perplexity through strata: windows of 512 tokens of the test stream (documents joined with
    <|endoftext|>, as in training), `strata run --tokens ... -n 0 --logits-out`, next-token NLL of every row."""
    import subprocess
    import tempfile

    import numpy as np

    encode = bpe_encoder(args.hf / "tokenizer.json")
    stream = []
    for doc in load_corpus(args.corpus)["test"]:
        stream += encode(doc["text"]) + [0]
    length = 512
    windows = min(args.windows or 1 << 30, len(stream) // (length + 1))
    log(f"test stream: {len(stream)} tokens, scoring {windows} windows of {length}")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            nll = 0.0
            for w in range(windows):
                ids = stream[w * (length + 1): (w + 1) * (length + 1)]
                subprocess.run([str(args.strata), "run", "-m", model, "--tokens", ",".join(map(str, ids[:length])),
                                "-n", "0", "--logits-out", f"{tmp}/logits.f32"], check=True, capture_output=True)
                logits = np.fromfile(f"{tmp}/logits.f32", dtype="<f4").reshape(length, -1).astype(np.float64)
                top = logits.max(1)
                logz = np.log(np.exp(logits - top[:, None]).sum(1)) + top
                nll += float((logz - logits[np.arange(length), ids[1:]]).sum())
            mean = nll / (windows * length)
            log(f"{model}: {windows * length} tokens, nll {mean:.6f}, perplexity {math.exp(mean):.4f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("train", "selftest"):
        p = sub.add_parser(name)
        p.add_argument("--corpus", type=Path, default=Path(".train/corpus.jsonl.xz"))
        p.add_argument("--out", type=Path, required=True, help="final outputs (metrics.json, model.tar.partNN)")
        p.add_argument("--work", type=Path, default=None, help="scratch directory (default OUT/pack)")
        p.add_argument("--time-budget", type=float, default=540.0, help="seconds from start to the packed output")
        p.add_argument("--vocab", type=int, default=6144)
        p.add_argument("--seq-len", type=int, default=512)
        p.add_argument("--batch", type=int, default=64)
        p.add_argument("--lr", type=float, default=2.5e-3)
        p.add_argument("--warmup", type=int, default=100)
        p.add_argument("--max-steps", type=int, default=0)
        p.add_argument("--log-every", type=int, default=25)
        p.add_argument("--val-every", type=float, default=60.0)
        p.add_argument("--val-windows", type=int, default=64)
        p.add_argument("--no-autocast", dest="autocast", action="store_false")
    fixture = sub.add_parser("fixture-check")
    fixture.add_argument("--fixture", type=Path,
                         default=Path(__file__).resolve().parent.parent / "tests/data/models/qwen4exp")
    ppl = sub.add_parser("strata-ppl", help="test perplexity of GGUF files through `strata run --logits-out`")
    ppl.add_argument("models", nargs="+")
    ppl.add_argument("--hf", type=Path, required=True, help="the HF directory with tokenizer.json")
    ppl.add_argument("--corpus", type=Path, default=Path(".train/corpus.jsonl.xz"))
    ppl.add_argument("--strata", type=Path, default=Path("build-model/strata"))
    ppl.add_argument("--windows", type=int, default=0, help="score only the first N windows (0 = all)")
    args = parser.parse_args()
    if args.command == "fixture-check":
        return cmd_fixture_check(args)
    if args.command == "strata-ppl":
        return cmd_strata_ppl(args)
    if not args.corpus.exists():
        print(f"error: corpus {args.corpus} not found (run tools/build_corpus.py first)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    return cmd_train(args) if args.command == "train" else cmd_selftest(args)


if __name__ == "__main__":
    sys.exit(main())
