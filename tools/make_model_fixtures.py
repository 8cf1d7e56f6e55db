#!/usr/bin/env python3
"""Exactness fixtures: tiny random HF transformers models and their reference outputs.

For each fixture (qwen4exp, qwen3next, qwen3moe, and the unseen-shape variants qwen4exp_dkdv, qwen3next_dkdv,
qwen4exp_dense: see ARCHS) this script
  1. builds a tiny model from a fixed seed in float32 with eager attention, randomising every norm weight
     (both the (1+w) kind and the plain kind), A_log, dt_bias, the zero-initialised PLE conv and any other
     all-zero parameter, so that no term of the forward pass is an identity or a zero;
  2. save_pretrained()s it (safetensors) into <out>/<fixture>/hf/ and checks that a reload gives bit-identical
     logits;
  3. records, under <out>/<fixture>/ref/ (little-endian float32 .bin files + manifest.json):
       - full-prefill logits for every position of every prompt,
       - 16 greedy tokens per prompt from a plain loop over the HF cache, and the logits of every step,
       - per-layer hidden states of prompt 0 (output_hidden_states=True),
       - max |cached token-by-token decode - full prefill| (must be < 1e-4) and
         max |greedy-step logits - full forward over prompt+continuation|;
  4. qwen4exp and qwen3next (not the variants): appends a random MTP head (`mtp.*`; reference qwen4exp.md §11 and
     qwen3next-qwen3moe.md Part A §6) to the safetensors and computes step-1 draft logits for prompt 0
     with a small PyTorch implementation built from HF's own modules, following vLLM's
     Qwen4ExpMultiTokenPredictor (one QSA decoder layer, RMSNorms, a hyper-connection mixer; see
     mtp_reference()) and Qwen3NextMultiTokenPredictor (fc, RMSNorms, one full-attention MoE decoder
     layer; see qwen3next_mtp_reference(), which also records one chained draft step).

It runs on CPU (exact, deterministic float32; no TF32) and needs torch, transformers (5.17 was used),
safetensors and numpy. docs/fixtures.md gives the exact command used to regenerate the committed files.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

N_GREEDY = 16
DECODE_TOLERANCE = 1e-4
NORM_STD = 0.3  # spread of randomised norm weights: (1+w) norms get w ~ N(0, 0.3), plain ones 1 + N(0, 0.3)

# ---------------------------------------------------------------------------------------------------------
# Configurations


def qwen4exp_config(**overrides):
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    # The reference §14 "parity config" with two deliberate changes, both to keep the fixture small and
    # useful: moe_intermediate_size 16 (instead of 32) keeps the checkpoint under 5 MB with 32 experts,
    # split_ngram_parts 2 (instead of 1) makes the converter concatenate PLE shards.
    return Qwen4ExpTextConfig(**{**dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=6, output_gate_type="sigmoid",
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        hc_count=4, hc_lowrank=16, ple_layer_ids=[2], ple_embed_dim=64, ple_conv_kernel_size=4,
        ngram_size=3, heads_per_ngram=8, ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=8,
        split_ngram_parts=2, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
        indexer_budget=8, indexer_compress_ratio=4, eos_token_id=2, bos_token_id=1, pad_token_id=0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        initializer_range=0.1,
    ), **overrides})


def qwen3next_config(**overrides):
    from transformers import Qwen3NextConfig

    # Reference qwen3next-qwen3moe.md Part A §10.
    return Qwen3NextConfig(**{**dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False, initializer_range=0.1,
    ), **overrides})


def qwen3moe_config():
    from transformers import Qwen3MoeConfig

    # Reference Part B tiny config, widened to 4 layers / 16 experts / top-4 / vocab 512.
    return Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
        num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False, initializer_range=0.1,
    )


def qwen4exp_dkdv_config():
    # Key head dim != value head dim (dk 16, dv 24): transformers accepts it, the GGUF carries it as
    # ssm.state_size = dk and ssm.inner_size = nv·dv. 16 experts and no MTP head keep the fixture small.
    return qwen4exp_config(linear_key_head_dim=16, linear_value_head_dim=24, num_experts=16)


def qwen3next_dkdv_config():
    # dk 24 > dv 16 (the other direction from qwen4exp_dkdv), no MTP head.
    return qwen3next_config(linear_key_head_dim=24, linear_value_head_dim=16)


def qwen4exp_dense_config():
    # QSA whose budget (128 tokens) covers every prompt + continuation (<= 88 tokens): transformers selects
    # every block, so its attention is dense. This is the reference for a GGUF whose
    # attention.compress_ratios holds 0 at the QSA blocks (llama.cpp then attends densely). No MTP head.
    return qwen4exp_config(indexer_budget=128, num_experts=16)


ARCHS = {
    # fixture: (arch, config factory, seed, with MTP head)
    "qwen4exp": ("qwen4exp", qwen4exp_config, 4001, True),
    "qwen3next": ("qwen3next", qwen3next_config, 3001, True),
    "qwen3moe": ("qwen3moe", qwen3moe_config, 2001, False),
    "qwen4exp_dkdv": ("qwen4exp", qwen4exp_dkdv_config, 4101, False),
    "qwen3next_dkdv": ("qwen3next", qwen3next_dkdv_config, 3101, False),
    "qwen4exp_dense": ("qwen4exp", qwen4exp_dense_config, 4201, False),
}


def make_prompts(vocab_size: int, eos: int, seed: int) -> list[list[int]]:
    """Three prompts, all longer than 40 tokens (QSA sparsity starts beyond 8 + 3 visible tokens).

    p0: 48 tokens with an EOS in the middle (PLE n-gram reset); p1: 41 tokens starting with EOS;
    p2: 72 tokens (crosses the 64-token GDN chunk) with two adjacent EOS tokens."""
    gen = torch.Generator().manual_seed(seed)

    def draw(n):
        return [int(t) for t in torch.randint(3, vocab_size, (n,), generator=gen)]

    p0 = draw(48)
    p0[19] = eos
    p1 = draw(41)
    p1[0] = eos
    p2 = draw(72)
    p2[30] = eos
    p2[31] = eos
    return [p0, p1, p2]


# ---------------------------------------------------------------------------------------------------------
# Model construction


HF_CLASSES = {"qwen4exp": "Qwen4ExpForCausalLM", "qwen3next": "Qwen3NextForCausalLM",
              "qwen3moe": "Qwen3MoeForCausalLM"}


def build_model(arch: str, config):
    import transformers

    cls = getattr(transformers, HF_CLASSES[arch])
    kwargs = {"attn_implementation": "eager"}
    try:
        model = cls._from_config(config, experts_implementation="eager", **kwargs)
    except (TypeError, ValueError) as err:
        print(f"  (_from_config without experts_implementation: {err})")
        model = cls._from_config(config, **kwargs)
    return model.float().eval()


def is_norm_name(name: str) -> bool:
    leaf = name.rsplit(".", 2)
    return any("norm" in part for part in leaf[-2:])


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> dict:
    """Randomises every parameter that random init leaves as an identity or a zero. Returns a report."""
    gen = torch.Generator().manual_seed(seed)
    report = {"one_plus_w_norms": [], "plain_norms": [], "other": []}
    for name, param in model.named_parameters():
        data = param.data
        if is_norm_name(name):
            if torch.all(data == 0):  # (1 + w) convention: w initialised to 0
                data.copy_(torch.randn(data.shape, generator=gen) * NORM_STD)
                report["one_plus_w_norms"].append(name)
            elif torch.all(data == 1):  # plain w convention: initialised to 1
                data.copy_(1 + torch.randn(data.shape, generator=gen) * NORM_STD)
                report["plain_norms"].append(name)
            else:
                raise RuntimeError(f"norm {name}: initialised neither to 0 nor to 1, cannot tell its convention")
        elif name.endswith("A_log"):
            data.copy_(torch.empty(data.shape).uniform_(0.1, 2.0, generator=gen).log())
            report["other"].append(name)
        elif name.endswith("dt_bias"):
            data.copy_(torch.randn(data.shape, generator=gen) * 0.5)
            report["other"].append(name)
        elif name.endswith("embed_tokens.weight"):
            # N(0, 1): gives every token a clear identity (the padding row would otherwise be zero).
            data.copy_(torch.randn(data.shape, generator=gen))
            report["other"].append(name)
        elif "conv1d" in name or torch.all(data == 0):
            # PLE conv1d is zero-initialised; GDN conv1d gets the same treatment for symmetry.
            data.copy_(torch.randn(data.shape, generator=gen) * 0.3)
            report["other"].append(name)
    for name, param in model.named_parameters():
        if torch.all(param.data == 0):
            raise RuntimeError(f"{name} is still all zero after randomisation")
    return report


# ---------------------------------------------------------------------------------------------------------
# Reference runs


def to_f32_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4").tobytes()


class RefWriter:
    """Writes named float32 arrays as <dir>/<name>.bin and remembers their shapes for the manifest."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files = {}
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, tensor: torch.Tensor, what: str):
        path = self.directory / f"{name}.bin"
        path.write_bytes(to_f32_bytes(tensor))
        self.files[name] = {"file": path.name, "shape": list(tensor.shape), "dtype": "f32", "what": what}


@torch.no_grad()
def logits_of(model, ids: list[int], **kwargs):
    out = model(input_ids=torch.tensor([ids]), **kwargs)
    return out


@torch.no_grad()
def token_by_token(model, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids[:1]]), use_cache=True)
    rows = [out.logits[0, -1]]
    cache = out.past_key_values
    for token in ids[1:]:
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1])
    return torch.stack(rows)


@torch.no_grad()
def greedy(model, ids: list[int], n_tokens: int):
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    step_logits = [out.logits[0, -1]]
    tokens = []
    for step in range(n_tokens):
        token = int(torch.argmax(step_logits[-1]))
        tokens.append(token)
        if step + 1 == n_tokens:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        step_logits.append(out.logits[0, -1])
    return tokens, torch.stack(step_logits)


def top2_margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


# ---------------------------------------------------------------------------------------------------------
# qwen4exp MTP head (transformers has none; reference qwen4exp.md §11)


def mtp_modules(model, config, seed: int):
    """Builds the MTP head from HF's own module classes and initialises every parameter at random."""
    mod = importlib.import_module(type(model).__module__)
    qsa_layers = [i for i, t in enumerate(config.layer_types) if t != "linear_attention"]
    qsa_index = qsa_layers[-1]
    if (qsa_index + 1) in (config.ple_layer_ids or []):
        raise RuntimeError("the MTP block must be built from a QSA layer without PLE")
    hidden, streams = config.hidden_size, config.hc_count
    head = torch.nn.ModuleDict({
        "fc_embedding": torch.nn.Linear(hidden, hidden, bias=False),
        "fc_hidden": torch.nn.Linear(hidden, hidden, bias=False),
        "pre_fc_norm_embedding": mod.Qwen4ExpTextRMSNorm(hidden, eps=config.rms_norm_eps),
        # vLLM: GemmaRMSNorm(H * hc_count): ONE RMS over all streams (reference §11 disagreement 1).
        "pre_fc_norm_hidden": mod.Qwen4ExpTextRMSNorm(hidden * streams, eps=config.rms_norm_eps),
        "hyper_connection_mixer": mod.Qwen4ExpTextGatedResidual(config, use_combine=False),
        "layer": mod.Qwen4ExpTextDecoderLayer(config, qsa_index),
    }).float().eval()
    randomize_head(head, config, seed)
    return head, qsa_index


@torch.no_grad()
def randomize_head(head, config, seed: int):
    """Every MTP-head parameter at random: norms (all of the (1+w) kind in both archs) ~ N(0, NORM_STD),
    everything else ~ N(0, initializer_range) (fresh modules would otherwise hold identities, zeros or
    uninitialised expert memory)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in head.named_parameters():
        if is_norm_name(name):
            param.copy_(torch.randn(param.shape, generator=gen) * NORM_STD)
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * config.initializer_range)


@torch.no_grad()
def mtp_reference(model, head, config, premixer: torch.Tensor, next_tokens: list[int]) -> torch.Tensor:
    """Step-1 draft logits for every position t of a sequence, following vLLM's Qwen4ExpMultiTokenPredictor.

    Entry t fuses h_t (the trunk's multi-stream residual before the final mixer at position t) with the token
    that follows position t (next_tokens[t]); it runs at position t, and the MTP block attends causally over
    entries 0..t of the same pass (its own KV, QSA indexer active), exactly as a drafter that prefilled the
    head over the prompt would see it.
        e  = fc_embedding(N1p(embed(tok); pre_fc_norm_embedding))
        hn = N1p(h; pre_fc_norm_hidden)          one RMS over all S*H values (vLLM, GemmaRMSNorm(S*H))
        X0_s = e + fc_hidden(hn_s)               for every stream s
        X1 = decoder_layer(X0)                    HC -> QSA -> HC -> MoE
        logits = lm_head(MIX_mtp(X1))"""
    seq_len = premixer.shape[0]
    hidden, streams = config.hidden_size, config.hc_count
    embeds = model.model.embed_tokens(torch.tensor([next_tokens]))
    e = head["fc_embedding"](head["pre_fc_norm_embedding"](embeds))  # [1, T, H]
    hn = head["pre_fc_norm_hidden"](premixer[None])  # [1, T, S*H]
    x0 = (e.unsqueeze(-2) + head["fc_hidden"](hn.view(1, seq_len, streams, hidden))).flatten(-2)
    positions = torch.arange(seq_len).view(1, 1, -1).expand(3, 1, -1)  # mRoPE rows t, h, w all equal pos
    cos, sin = model.model.rotary_emb(x0, positions)
    blocked = torch.finfo(torch.float32).min
    mask = torch.full((seq_len, seq_len), blocked).triu(1)[None, None]
    layer_kwargs = {"position_embeddings": (cos, sin), "attention_mask": mask, "conv_mask": None,
                    "past_key_values": None, "ple_input_ids": None}
    accepted = inspect.signature(head["layer"].forward).parameters
    x1 = head["layer"](x0, **{k: v for k, v in layer_kwargs.items() if k in accepted})
    if isinstance(x1, tuple):
        x1 = x1[0]
    return model.lm_head(head["hyper_connection_mixer"](x1))[0]


def mtp_state_dict(head, saved_keys: set[str], qsa_index: int) -> dict[str, torch.Tensor]:
    """The head's tensors under the checkpoint names of reference §11, in the trunk's saved key format."""
    out = {}
    for name in ("fc_embedding", "fc_hidden", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        out[f"mtp.{name}.weight"] = head[name].weight.detach().clone()
    for key, value in head["hyper_connection_mixer"].state_dict().items():
        out[f"mtp.hyper_connection_mixer.{key}"] = value.detach().clone()
    out.update(mtp_layer_state_dict(head["layer"], saved_keys, qsa_index))
    return out


def mtp_layer_state_dict(layer, saved_keys: set[str], trunk_index: int) -> dict[str, torch.Tensor]:
    """The MTP decoder layer's tensors as mtp.layers.0.*, in the saved key format of trunk layer trunk_index
    (save_pretrained writes per-expert keys; the module holds fused expert tensors)."""
    out = {}
    trunk_prefix = f"model.layers.{trunk_index}."
    trunk_suffixes = {k[len(trunk_prefix):] for k in saved_keys if k.startswith(trunk_prefix)}
    layer_sd = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    for suffix in sorted(trunk_suffixes):
        if suffix in layer_sd:
            out[f"mtp.layers.0.{suffix}"] = layer_sd[suffix]
            continue
        match = re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", suffix)
        if not match:
            raise RuntimeError(f"MTP: no tensor for trunk key suffix {suffix}; layer has {sorted(layer_sd)}")
        expert, which = int(match.group(1)), match.group(2)
        if which == "down":
            out[f"mtp.layers.0.{suffix}"] = layer_sd["mlp.experts.down_proj"][expert].clone()
        else:
            gate_up = layer_sd["mlp.experts.gate_up_proj"][expert]
            half = gate_up.shape[0] // 2
            out[f"mtp.layers.0.{suffix}"] = (gate_up[:half] if which == "gate" else gate_up[half:]).clone()
    return out


# ---------------------------------------------------------------------------------------------------------
# qwen3next MTP head (transformers has none; reference qwen3next-qwen3moe.md Part A §6, vLLM Qwen3NextMTP)


def qwen3next_mtp_modules(model, config, seed: int):
    """The Qwen3-Next MTP head from HF's own module classes: fc [H, 2H], three (1+w) RMSNorms and one
    full-attention + MoE decoder layer (built at the index of the trunk's last full-attention layer)."""
    mod = importlib.import_module(type(model).__module__)
    index = [i for i, t in enumerate(config.layer_types) if t == "full_attention"][-1]
    hidden = config.hidden_size
    head = torch.nn.ModuleDict({
        "fc": torch.nn.Linear(2 * hidden, hidden, bias=False),
        "pre_fc_norm_embedding": mod.Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps),
        "pre_fc_norm_hidden": mod.Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps),
        "norm": mod.Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps),
        "layer": mod.Qwen3NextDecoderLayer(config, index),
    }).float().eval()
    randomize_head(head, config, seed)
    return head, index


@torch.no_grad()
def final_hidden_of(model, ids: list[int]) -> torch.Tensor:
    """The trunk's output after the final model.norm, [T, H] (what vLLM's Qwen3-Next MTP consumes)."""
    captured = {}
    hook = model.model.norm.register_forward_hook(
        lambda module, args, out: captured.__setitem__("h", out.detach().clone()))
    model(input_ids=torch.tensor([ids]))
    hook.remove()
    return captured["h"][0]


@torch.no_grad()
def qwen3next_mtp_reference(model, head, hidden: torch.Tensor, next_tokens: list[int]):
    """Draft logits for entries 0..n-1 following vLLM's Qwen3NextMultiTokenPredictor.

    Entry t fuses hidden[t] with token next_tokens[t] and runs at position t; the decoder layer attends
    causally over entries 0..t of the same pass (its own KV):
        x = fc(cat[N1p(embed(tok); pre_fc_norm_embedding), N1p(h; pre_fc_norm_hidden)])   embedding first
        y = decoder_layer(x)                      pre-norm attention + MoE, residuals inside
        out = N1p(y; norm);  logits = lm_head(out)
    Returns (logits [n, vocab], out [n, H]); `out` is what a chained draft feeds back as its hidden."""
    seq_len = hidden.shape[0]
    e = head["pre_fc_norm_embedding"](model.model.embed_tokens(torch.tensor([next_tokens])))
    h = head["pre_fc_norm_hidden"](hidden[None])
    x = head["fc"](torch.cat([e, h], dim=-1))
    positions = torch.arange(seq_len)[None]
    cos, sin = model.model.rotary_emb(x, positions)
    mask = torch.full((seq_len, seq_len), torch.finfo(torch.float32).min).triu(1)[None, None]
    layer_kwargs = {"position_embeddings": (cos, sin), "attention_mask": mask, "position_ids": positions,
                    "past_key_values": None}
    accepted = inspect.signature(head["layer"].forward).parameters
    y = head["layer"](x, **{k: v for k, v in layer_kwargs.items() if k in accepted})
    if isinstance(y, tuple):
        y = y[0]
    out = head["norm"](y)
    return model.lm_head(out)[0], out[0]


def append_mtp_to_checkpoint(hf_dir: Path, mtp: dict[str, torch.Tensor]) -> dict:
    """Adds the head's tensors to model.safetensors (trunk tensors unchanged, checked) and
    mtp_num_hidden_layers = 1 to config.json; returns the new config."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(hf_dir / "model.safetensors")
    clash = set(mtp) & set(tensors)
    if clash:
        raise RuntimeError(f"MTP names clash with trunk names: {sorted(clash)}")
    save_file({**tensors, **mtp}, hf_dir / "model.safetensors", metadata={"format": "pt"})
    after = load_file(hf_dir / "model.safetensors")
    for key, value in tensors.items():
        if not torch.equal(after[key], value):
            raise RuntimeError(f"rewriting the safetensors changed {key}")
    config_json = json.loads((hf_dir / "config.json").read_text())
    config_json["mtp_num_hidden_layers"] = 1
    (hf_dir / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
    return config_json


# ---------------------------------------------------------------------------------------------------------


def versions() -> dict:
    import safetensors
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__, "python": sys.version.split()[0]}


def make_fixture(fixture: str, out_root: Path) -> dict:
    from safetensors.torch import load_file, save_file

    arch, factory, seed, with_mtp = ARCHS[fixture]
    print(f"== {fixture}" + (f" ({arch})" if fixture != arch else ""))
    torch.manual_seed(seed)
    config = factory()
    model = build_model(arch, config)
    report = randomize(model, seed + 1)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  parameters: {n_params} ({n_params * 4 / 1e6:.2f} MB f32); randomised "
          f"{len(report['one_plus_w_norms'])} (1+w) norms, {len(report['plain_norms'])} plain norms, "
          f"{len(report['other'])} others")

    arch_dir = out_root / fixture
    hf_dir = arch_dir / "hf"
    if arch_dir.exists():
        shutil.rmtree(arch_dir)
    model.save_pretrained(hf_dir)
    for extra in hf_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    ref = RefWriter(arch_dir / "ref")
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else config.eos_token_id[0]
    prompts = make_prompts(config.vocab_size, eos, seed + 2)

    # The saved files are the truth: a reload must reproduce the logits bit for bit.
    import transformers

    cls = getattr(transformers, HF_CLASSES[arch])
    try:
        reloaded = cls.from_pretrained(hf_dir, attn_implementation="eager", experts_implementation="eager",
                                       dtype=torch.float32).eval()
    except (TypeError, ValueError) as err:
        print(f"  (from_pretrained without experts_implementation: {err})")
        reloaded = cls.from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32).eval()
    built_state, reloaded_state = model.state_dict(), reloaded.state_dict()
    if set(built_state) != set(reloaded_state):
        raise RuntimeError(f"{arch}: reload has other tensors: {set(built_state) ^ set(reloaded_state)}")
    for key, value in built_state.items():
        if not torch.equal(value, reloaded_state[key]):
            raise RuntimeError(f"{arch}: reloaded tensor {key} differs from the built one")
    reload_diff = float((logits_of(model, prompts[0]).logits - logits_of(reloaded, prompts[0]).logits)
                        .abs().max())
    experts_impl = getattr(model.config, "_experts_implementation", None)
    print(f"  reload: all {len(built_state)} tensors bit-identical; logits max |diff| = {reload_diff:.3g} "
          f"(experts implementation built={experts_impl}, "
          f"reloaded={getattr(reloaded.config, '_experts_implementation', None)})")
    del reloaded

    manifest_prompts = []
    decode_diffs, continuation_diffs = [], []
    for index, ids in enumerate(prompts):
        prefill = logits_of(model, ids).logits[0]
        ref.write(f"prefill_logits_p{index}", prefill, f"full-prefill logits of prompt {index}, [T, vocab]")
        if index == 0 and arch == "qwen4exp" and with_mtp:
            ref.write("trunk_premixer_p0", premixer_of(model, ids),
                      "prompt 0: multi-stream residual before the final mixer, [T, hc_count*hidden]")
        stepwise = token_by_token(model, ids)
        decode_diff = float((stepwise - prefill).abs().max())
        tokens, step_logits = greedy(model, ids, N_GREEDY)
        ref.write(f"greedy_logits_p{index}", step_logits,
                  f"prompt {index}: logits of greedy step k (row 0 = prefill's last row), [{N_GREEDY}, vocab]")
        full = logits_of(model, ids + tokens[:-1]).logits[0, len(ids) - 1:]
        continuation_diff = float((full - step_logits).abs().max())
        margins = [top2_margin(row) for row in step_logits]
        print(f"  p{index}: T={len(ids)} decode-vs-prefill max|diff|={decode_diff:.3g} "
              f"greedy-vs-full max|diff|={continuation_diff:.3g} min top-2 margin={min(margins):.3g} "
              f"tokens={tokens}")
        decode_diffs.append(decode_diff)
        continuation_diffs.append(continuation_diff)
        manifest_prompts.append({
            "ids": ids, "greedy_tokens": tokens, "greedy_top2_margins": margins,
            "decode_vs_prefill_max_abs_diff": decode_diff, "greedy_vs_full_max_abs_diff": continuation_diff,
        })

    out = model(input_ids=torch.tensor([prompts[0]]), output_hidden_states=True)
    hidden_states = [h[0] for h in (out.hidden_states or ())]
    hidden_info = []
    for layer, h in enumerate(hidden_states):
        ref.write(f"hidden_p0_{layer}", h, f"prompt 0: output_hidden_states[{layer}], [T, width]")
        hidden_info.append(list(h.shape))

    manifest = {
        "arch": fixture,  # the fixture's name: the architecture itself for the three base fixtures
        "hf_class": type(model).__name__,
        "versions": versions(),
        "dtype": "float32",
        "attn_implementation": "eager",
        "experts_implementation": experts_impl,
        "reload_logits_max_abs_diff": reload_diff,
        "device": "cpu",
        "seed": seed,
        "n_params": n_params,
        "config": json.loads((hf_dir / "config.json").read_text()),
        "randomised": report,
        "prompts": manifest_prompts,
        "decode_tolerance": DECODE_TOLERANCE,
        "max_decode_vs_prefill": max(decode_diffs),
        "max_greedy_vs_full": max(continuation_diffs),
        "hidden_states_p0_shapes": hidden_info,
    }

    if arch == "qwen4exp" and with_mtp:
        # model.config carries the eager attention / experts implementations the trunk ran with.
        head, qsa_index = mtp_modules(model, model.config, seed + 3)
        next_tokens = prompts[0][1:] + [manifest_prompts[0]["greedy_tokens"][0]]
        draft = mtp_reference(model, head, model.config, premixer_of(model, prompts[0]), next_tokens)
        ref.write("mtp_draft_logits_p0", draft,
                  "prompt 0: MTP step-1 draft logits; row t fuses h_t with token next_tokens[t], [T, vocab]")
        mtp = mtp_state_dict(head, set(load_file(hf_dir / "model.safetensors")), qsa_index)
        manifest["config"] = append_mtp_to_checkpoint(hf_dir, mtp)
        manifest["mtp"] = {
            "tensors": sorted(mtp),
            "built_from_trunk_layer": qsa_index,
            "next_tokens": next_tokens,
            "follows": "vLLM Qwen4ExpMultiTokenPredictor",
            "pre_fc_norm_hidden": "one RMS over all hc_count*hidden values (vLLM), not per stream (llama.cpp)",
            "position_convention": "entry t runs at position t with h_t (trunk residual before the final mixer "
                                   "at t) and the token at t+1; causal attention over entries 0..t",
            "attention": "QSA with its indexer active (same HF decoder layer class as the trunk)",
            "greedy_draft_tokens": [int(t) for t in torch.argmax(draft, dim=-1)],
        }

    if arch == "qwen3next" and with_mtp:
        head, full_index = qwen3next_mtp_modules(model, model.config, seed + 3)
        next_tokens = prompts[0][1:] + [manifest_prompts[0]["greedy_tokens"][0]]
        hidden = final_hidden_of(model, prompts[0])
        ref.write("trunk_final_hidden_p0", hidden, "prompt 0: trunk output after model.norm, [T, hidden]")
        draft, out = qwen3next_mtp_reference(model, head, hidden, next_tokens)
        ref.write("mtp_draft_logits_p0", draft,
                  "prompt 0: MTP step-1 draft logits; row t fuses h_t with token next_tokens[t], [T, vocab]")
        # One chained step after the last entry: hidden = the head's own normed output there, token =
        # its draft, position T; rerunning the whole pass leaves rows 0..T-1 unchanged (causal).
        chain_token = int(torch.argmax(draft[-1]))
        chain_draft, _ = qwen3next_mtp_reference(model, head, torch.cat([hidden, out[-1:]]),
                                                 next_tokens + [chain_token])
        if float((chain_draft[:-1] - draft).abs().max()) > 1e-5:
            raise RuntimeError("qwen3next MTP: rerunning with one more entry changed earlier rows")
        ref.write("mtp_chain_logits_p0", chain_draft[-1:],
                  "prompt 0: draft logits of one chained step after the last entry, [1, vocab]")
        mtp = {f"mtp.{name}.weight": head[name].weight.detach().clone()
               for name in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
        mtp.update(mtp_layer_state_dict(head["layer"], set(load_file(hf_dir / "model.safetensors")), full_index))
        manifest["config"] = append_mtp_to_checkpoint(hf_dir, mtp)
        manifest["mtp"] = {
            "tensors": sorted(mtp),
            "built_from_trunk_layer": full_index,
            "next_tokens": next_tokens,
            "follows": "vLLM Qwen3NextMultiTokenPredictor",
            "position_convention": "entry t runs at position t with h_t (trunk output after model.norm at t) and "
                                   "the token at t+1; causal attention over entries 0..t",
            "chain": {"token": chain_token, "position": len(next_tokens),
                      "hidden": "the head's output after mtp.norm at the last entry"},
            "greedy_draft_tokens": [int(t) for t in torch.argmax(draft, dim=-1)],
        }

    manifest["files"] = ref.files
    (ref.directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(arch_dir.rglob("*")) if p.is_file()}
    print(f"  files: {sum(sizes.values()) / 1e6:.2f} MB total; hf: "
          f"{sum(p.stat().st_size for p in hf_dir.iterdir()) / 1e6:.2f} MB")
    if max(decode_diffs) >= DECODE_TOLERANCE or max(continuation_diffs) >= DECODE_TOLERANCE:
        print(f"  FAIL: {fixture} cached decode differs from prefill by more than {DECODE_TOLERANCE}")
        manifest["failed"] = True
    return manifest


@torch.no_grad()
def premixer_of(model, ids: list[int]) -> torch.Tensor:
    captured = {}
    hook = model.model.hyper_connection_mixer.register_forward_pre_hook(
        lambda module, args: captured.__setitem__("x", args[0].detach().clone()))
    model(input_ids=torch.tensor([ids]))
    hook.remove()
    return captured["x"][0]


def dump_sources(directory: Path):
    """Saves the installed transformers sources these fixtures depend on (to read, for checking the math)."""
    directory.mkdir(parents=True, exist_ok=True)
    for module_name in ("transformers.models.qwen4_exp.modeling_qwen4_exp",
                        "transformers.models.qwen4_exp.configuration_qwen4_exp",
                        "transformers.models.qwen3_next.modeling_qwen3_next",
                        "transformers.models.qwen3_next.configuration_qwen3_next",
                        "transformers.models.qwen3_moe.modeling_qwen3_moe",
                        "transformers.models.qwen3_moe.configuration_qwen3_moe",
                        "transformers.conversion_mapping"):
        try:
            module = importlib.import_module(module_name)
            (directory / (module_name.rsplit(".", 1)[1] + ".py")).write_text(inspect.getsource(module))
        except Exception as err:  # noqa: BLE001 - a missing module is reported, not fatal
            print(f"  cannot dump {module_name}: {err}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/data/models")
    parser.add_argument("--archs", nargs="*", default=list(ARCHS))
    parser.add_argument("--dump-sources", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    print("versions:", json.dumps(versions()))
    if args.dump_sources:
        dump_sources(args.dump_sources)
    failed = []
    for fixture in args.archs:
        manifest = make_fixture(fixture, args.out)
        if manifest.get("failed"):
            failed.append(fixture)
        print(f"  max decode-vs-prefill {manifest['max_decode_vs_prefill']:.3g}, "
              f"max greedy-vs-full {manifest['max_greedy_vs_full']:.3g}")
    if failed:
        print(f"FAILED: {failed}")
        return 1
    print("all fixtures written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
