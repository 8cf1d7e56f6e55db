"""Evaluation, export and transformers parity for tools/train_default_model.py.

  * `evaluate()`: held-out perplexity (trunk), MTP next-next-token loss and accuracy, MTP/trunk agreement, expert
    routing statistics per MoE layer and the QSA selected-key fraction, in float32 (TF32 off).
  * `speculative_acceptance()`: greedy generation from held-out prompts where every step's MTP draft (fed the token
    the trunk just chose) is checked against the trunk's next greedy token.
  * `export_hf()`: builds transformers' `Qwen4ExpForCausalLM` from the module's weights (strict load),
    `save_pretrained()`s it in bfloat16 and appends the `mtp.*` tensors in the trunk's saved key format.
  * `parity()`: reloads the export with `from_pretrained` (float32, eager) and compares logits with the module
    (exact HF block selection, and the batched one), plus the MTP head against one built from HF's own modules.
Every failure raises RuntimeError with the tensor/metric and the numbers involved.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import qwen4exp_io as qio


def windows(stream: torch.Tensor, length: int, limit: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of `length` tokens ([n, length]), at most `limit` of them."""
    n = (stream.numel() // length) if limit is None else min(limit, stream.numel() // length)
    return stream[: n * length].view(n, length)


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, batch: int, limit: int | None = None,
             autocast: bool = False) -> dict:
    """Teacher-forced metrics on windows of seq_len + 2 tokens (the 2 extra are the MTP's targets)."""
    model.eval()
    device = next(model.parameters()).device
    data = windows(stream, seq_len + 2, limit)
    shape = model.shape
    n_moe = shape.num_hidden_layers + (1 if model.mtp is not None else 0)
    mass = torch.zeros(n_moe, shape.num_experts, dtype=torch.float64)
    picks = torch.zeros(n_moe, shape.num_experts, dtype=torch.float64)
    sums = {"nll": 0.0, "tokens": 0, "top1": 0, "mtp_nll": 0.0, "mtp_top1": 0, "agree": 0, "agree_n": 0}
    selected = []
    for start in range(0, data.shape[0], batch):
        ids = data[start: start + batch].to(device)
        x, nxt, nxt2 = ids[:, :seq_len], ids[:, 1: seq_len + 1], ids[:, 2: seq_len + 2]
        aux = {"routing": [], "selected_fraction": []}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            pre, logits = model.trunk(x, aux)
            draft = model.mtp_logits(pre, nxt, aux) if model.mtp is not None else None
        logits = logits.float()
        sums["nll"] += float(F.cross_entropy(logits.flatten(0, 1), nxt.flatten(), reduction="sum"))
        sums["tokens"] += nxt.numel()
        greedy = logits.argmax(-1)
        sums["top1"] += int((greedy == nxt).sum())
        if draft is not None:
            draft = draft.float()
            sums["mtp_nll"] += float(F.cross_entropy(draft.flatten(0, 1), nxt2.flatten(), reduction="sum"))
            guess = draft.argmax(-1)
            sums["mtp_top1"] += int((guess == nxt2).sum())
            # draft at t (fed the true token t+1) vs the trunk's greedy choice at t+1 (given the true context)
            sums["agree"] += int((guess[:, :-1] == greedy[:, 1:]).sum())
            sums["agree_n"] += guess[:, :-1].numel()
        for layer, (top_i, top_w) in enumerate(aux["routing"]):
            mass[layer].index_add_(0, top_i.flatten().cpu(), top_w.flatten().double().cpu())
            picks[layer].index_add_(0, top_i.flatten().cpu(), torch.ones(top_i.numel(), dtype=torch.float64))
        selected += aux["selected_fraction"]
    out = {"windows": int(data.shape[0]), "seq_len": seq_len, "tokens": sums["tokens"],
           "nll": sums["nll"] / sums["tokens"], "ppl": math.exp(sums["nll"] / sums["tokens"]),
           "top1": sums["top1"] / sums["tokens"]}
    if model.mtp is not None:
        out.update({"mtp_nll": sums["mtp_nll"] / sums["tokens"], "mtp_ppl": math.exp(sums["mtp_nll"] / sums["tokens"]),
                    "mtp_top1_vs_true_next_next": sums["mtp_top1"] / sums["tokens"],
                    "mtp_agreement_with_trunk_greedy": sums["agree"] / max(1, sums["agree_n"])})
    out["experts"] = routing_report(mass, picks)
    out["qsa_selected_key_fraction_of_causal"] = sum(selected) / max(1, len(selected))
    return out


def routing_report(mass: torch.Tensor, picks: torch.Tensor) -> dict:
    """Per MoE layer: share of routing mass (renormalised top-k weights) held by the top 10% of experts."""
    experts = mass.shape[1]
    top_n = max(1, math.ceil(experts / 10))
    layers = []
    for layer in range(mass.shape[0]):
        share = mass[layer] / mass[layer].sum().clamp_min(1e-12)
        load = picks[layer] / picks[layer].sum().clamp_min(1e-12)
        layers.append({"top10pct_mass_share": float(share.sort(descending=True).values[:top_n].sum()),
                       "max_expert_share": float(share.max()), "min_expert_share": float(share.min()),
                       "unused_experts": int((picks[layer] == 0).sum()),
                       "top10pct_pick_share": float(load.sort(descending=True).values[:top_n].sum())})
    return {"top_n_experts": top_n, "uniform_share_of_top_n": top_n / experts,
            "mean_top10pct_mass_share": sum(x["top10pct_mass_share"] for x in layers) / len(layers),
            "layers": layers}


@torch.no_grad()
def speculative_acceptance(model, prompts: torch.Tensor, new_tokens: int) -> dict:
    """Greedy decode (full recompute each step); the MTP drafts token s+1 from (h at the last position, token s)."""
    model.eval()
    seq = prompts.clone()
    accepted, checked, draft = 0, 0, None
    for _ in range(new_tokens):
        pre, logits = model.trunk(seq, {})
        chosen = logits[:, -1].argmax(-1)
        if draft is not None:
            accepted += int((draft == chosen).sum())
            checked += chosen.numel()
        nxt = torch.cat([seq[:, 1:], chosen[:, None]], dim=1)
        draft = model.mtp_logits(pre, nxt, {})[:, -1].argmax(-1)
        seq = torch.cat([seq, chosen[:, None]], dim=1)
    return {"prompts": int(prompts.shape[0]), "prompt_tokens": int(prompts.shape[1]), "new_tokens": new_tokens,
            "acceptance": accepted / max(1, checked), "checked": checked}


# ------------------------------------------------------------------------------------------------------------
# transformers export and parity


def build_hf(shape: qio.Qwen4ExpShape):
    import transformers
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    config = Qwen4ExpTextConfig(**shape.hf_config_kwargs())
    cls = transformers.Qwen4ExpForCausalLM
    try:
        model = cls._from_config(config, attn_implementation="eager", experts_implementation="eager")
    except (TypeError, ValueError) as err:
        print(f"  (_from_config without experts_implementation: {err})")
        model = cls._from_config(config, attn_implementation="eager")
    return model.float().eval()


def load_hf(directory: Path):
    import transformers

    cls = transformers.Qwen4ExpForCausalLM
    try:
        model = cls.from_pretrained(directory, attn_implementation="eager", experts_implementation="eager",
                                    dtype=torch.float32)
    except (TypeError, ValueError) as err:
        print(f"  (from_pretrained without experts_implementation: {err})")
        model = cls.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def export_hf(model, out_dir: Path) -> dict:
    """Writes config.json + model.safetensors (bfloat16, trunk via save_pretrained, then mtp.*)."""
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    hf = build_hf(model.shape)
    # int64 PLE buffers must stay int64: a float round trip rounds the 50-bit hash multipliers
    hf.load_state_dict({k: (v.float() if v.is_floating_point() else v).cpu()
                        for k, v in qio.trunk_state_dict(model).items()}, strict=True)
    for key, value in hf.state_dict().items():
        if value.dtype == torch.long and not torch.equal(value, qio.trunk_state_dict(model)[key].cpu()):
            raise RuntimeError(f"export: int64 buffer {key} changed on the way into transformers")
    hf.to(torch.bfloat16).save_pretrained(out_dir, max_shard_size="2GB")
    for extra in out_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    tensors = load_file(out_dir / "model.safetensors")
    mtp = {k: v.to(torch.bfloat16) for k, v in qio.mtp_saved_tensors(model, set(tensors)).items()}
    clash = set(mtp) & set(tensors)
    if clash:
        raise RuntimeError(f"export: MTP names clash with trunk names: {sorted(clash)[:5]}")
    save_file({**tensors, **mtp}, out_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    own_layout = set(qio.saved_format_tensors(model))
    saved = set(tensors) | set(mtp)
    if own_layout != saved:  # not fatal: strata reads what transformers wrote; the local selftest uses ours
        print(f"  WARNING: transformers saved other names than saved_format_tensors(): only HF "
              f"{sorted(saved - own_layout)[:5]}, only ours {sorted(own_layout - saved)[:5]}", flush=True)
    return {"tensors": len(saved), "mtp_tensors": len(mtp), "layout_matches_saved_format": own_layout == saved,
            "bytes": (out_dir / "model.safetensors").stat().st_size}


@torch.no_grad()
def hf_mtp_reference(hf, model, premixer, next_ids):
    """The MTP head rebuilt from transformers' own modules (vLLM convention), loaded with the module's weights."""
    mod = importlib.import_module(type(hf).__module__)
    config, head = hf.config, model.mtp
    h, s = config.hidden_size, config.hc_count
    layer = mod.Qwen4ExpTextDecoderLayer(config, head.trunk_layer_index).float().eval()
    layer.load_state_dict(head.layers[0].state_dict(), strict=True)
    norm_e = mod.Qwen4ExpTextRMSNorm(h, eps=config.rms_norm_eps)
    norm_h = mod.Qwen4ExpTextRMSNorm(h * s, eps=config.rms_norm_eps)
    norm_e.weight.copy_(head.pre_fc_norm_embedding.weight)
    norm_h.weight.copy_(head.pre_fc_norm_hidden.weight)
    mixer = mod.Qwen4ExpTextGatedResidual(config, use_combine=False).float().eval()
    mixer.load_state_dict(head.hyper_connection_mixer.state_dict(), strict=True)
    seq = next_ids.shape[1]
    e = F.linear(norm_e(hf.model.embed_tokens(next_ids)), head.fc_embedding.weight)
    hn = norm_h(premixer).view(*premixer.shape[:-1], s, h)
    x0 = (e.unsqueeze(-2) + F.linear(hn, head.fc_hidden.weight)).flatten(-2)
    positions = torch.arange(seq).view(1, 1, -1).expand(3, next_ids.shape[0], -1)
    cos, sin = hf.model.rotary_emb(x0, positions)
    mask = torch.full((seq, seq), torch.finfo(torch.float32).min).triu(1)[None, None]
    mask = mask.expand(next_ids.shape[0], 1, seq, seq)  # HF's indexer reads the mask per batch row
    kwargs = {"position_embeddings": (cos, sin), "attention_mask": mask, "conv_mask": None,
              "past_key_values": None, "ple_input_ids": None}
    accepted = inspect.signature(layer.forward).parameters
    x1 = layer(x0, **{k: v for k, v in kwargs.items() if k in accepted})
    x1 = x1[0] if isinstance(x1, tuple) else x1
    return hf.lm_head(mixer(x1))


@torch.no_grad()
def parity(model, hf_dir: Path, ids: torch.Tensor, tolerance: float) -> dict:
    """model: float32 on CPU with the exported (bf16-rounded) weights. ids: [B, T+1] held-out tokens."""
    hf = load_hf(hf_dir)
    mine, theirs = qio.trunk_state_dict(model), hf.state_dict()
    if set(mine) != set(theirs):
        raise RuntimeError(f"parity: reloaded names differ: only HF {sorted(set(theirs) - set(mine))[:5]}, "
                           f"only ours {sorted(set(mine) - set(theirs))[:5]}")
    weight_diff = max(float((mine[k].double() - theirs[k].double()).abs().max()) for k in mine)
    x, nxt = ids[:, :-1], ids[:, 1:]
    ref = hf(input_ids=x, output_hidden_states=True)
    pre_exact, out_exact = model.trunk(x, {}, exact_selection=True)
    _, out_batched = model.trunk(x, {})
    scale = float(ref.logits.abs().max())
    captured = {}
    hook = hf.model.hyper_connection_mixer.register_forward_pre_hook(
        lambda module, args: captured.__setitem__("x", args[0].detach().clone()))
    hf(input_ids=x)
    hook.remove()
    report = {"batch": list(x.shape), "weights_max_abs_diff": weight_diff, "logits_max_abs": scale,
              "logits_max_abs_diff_exact_selection": float((out_exact - ref.logits).abs().max()),
              "logits_max_abs_diff_batched_selection": float((out_batched - ref.logits).abs().max()),
              "premixer_max_abs_diff": float((pre_exact - captured["x"]).abs().max()),
              "greedy_agreement": float((out_exact.argmax(-1) == ref.logits.argmax(-1)).float().mean()),
              "tolerance": tolerance, "mtp_logits_max_abs_diff": None}
    print(f"  trunk parity: {json.dumps(report)}", flush=True)
    draft_ref = hf_mtp_reference(hf, model, captured["x"], nxt)  # the trunk numbers are printed even if this fails
    draft_mine = model.mtp_logits(pre_exact, nxt, {}, exact_selection=True)
    report["mtp_logits_max_abs_diff"] = float((draft_mine - draft_ref).abs().max())
    report["ok"] = (weight_diff == 0.0 and report["logits_max_abs_diff_exact_selection"] <= tolerance
                    and report["mtp_logits_max_abs_diff"] <= tolerance)
    if not report["ok"] and ref.hidden_states is not None:  # where does it start to differ?
        per_layer = []
        big_x = model.model.embed_tokens(x).repeat(1, 1, model.shape.hc_count)
        from qwen4exp_torch import rope_tables
        cos, sin = rope_tables(model.shape, torch.arange(x.shape[1]), big_x.dtype)
        for i, layer in enumerate(model.model.layers):
            per_layer.append(float((big_x - ref.hidden_states[i]).abs().max()))
            big_x = layer(big_x, x, cos, sin, {}, True, False)
        report["hidden_state_diffs_per_layer_input"] = per_layer
    return report


@torch.no_grad()
def hf_greedy(hf_dir: Path, prompt: list, steps: int) -> dict:
    """Reference for strata: HF's prefill logits of `prompt` and `steps` greedy tokens through HF's cache."""
    hf = load_hf(hf_dir)
    out = hf(input_ids=torch.tensor([prompt]), use_cache=True)
    prefill = out.logits[0].clone()
    cache, tokens = out.past_key_values, []
    logits = out.logits[0, -1]
    for _ in range(steps):
        token = int(logits.argmax())
        tokens.append(token)
        out = hf(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[0, -1]
    return {"prefill_logits": prefill, "greedy": tokens}
