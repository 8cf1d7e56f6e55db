"""A vectorised PyTorch qwen4exp (Qwen3.8-Flash-Next text model) with an MTP head, for training.

What it promises:
  * Parameter and buffer names are exactly those of transformers' `Qwen4ExpForCausalLM` at run time
    (`model.layers.N.linear_attn.in_proj_qkv.weight`, fused `mlp.experts.gate_up_proj`, one
    `ple.ple_embedding.ngram_embedding.weight`, ...), so `hf_model.load_state_dict(trunk_state_dict(m))`
    works with strict=True. The MTP head lives under `mtp.*` with the names llama.cpp's converter and
    strata read (reference qwen4exp.md §11; `mtp.layers.0.*` is named like a trunk QSA layer).
  * The math is the reference's (docs: /work/shared/reference/qwen4exp.md, HF `modeling_qwen4_exp.py`):
    same norms (1+w in float32), hyper-connections, chunked Gated DeltaNet (C = 64, solve_triangular),
    QSA with its block indexer, softmax/top-k/renormalised MoE with a sigmoid-gated shared expert, PLE n-gram
    hashing with EOS reset, final mixer without norm, untied lm_head. The only deliberate differences are
    summation orders: routed experts are computed densely (all experts, zero weight for unselected ones), which
    equals HF's per-expert loop up to float rounding (~1e-7 in float32).
  * The QSA block choice is batched (`topk` over all blocks of all queries). Ties between equal block scores
    (relu makes exact zeros common) may be broken differently from HF's per-query `topk`; pass
    `exact_selection=True` to run HF's per-query selection loop instead (slow; for parity checks).
  * Training extras (not part of the inference model): a Switch-style load-balancing loss per MoE layer and a
    KL loss that teaches each QSA indexer to rank blocks by the dense attention mass (the indexer gets no
    gradient from the language-model loss because top-k selection is not differentiable). Both are returned
    in `aux`; neither changes the forward output.

No padding and no KV cache: every sequence starts at position 0 with an empty history (training and parity).
"""
from __future__ import annotations

import math
import torch
import torch.nn as nn
import torch.nn.functional as F

from qwen4exp_io import LINEAR, QSA, Qwen4ExpShape


# ------------------------------------------------------------------------------------------------------------
# Small pieces


class OnePlusRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * (1 + w), in float32, cast back; optional per-group RMS (grouped G1p)."""

    def __init__(self, dim: int, eps: float, group: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps, self.group = eps, group

    def forward(self, x):
        x32 = x.float()
        if self.group is not None:
            g = x32.unflatten(-1, (-1, self.group))
            x32 = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        else:
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def linear(i: int, o: int) -> nn.Linear:
    return nn.Linear(i, o, bias=False)


def rotate(x, cos, sin):
    """Partial NeoX RoPE on the first cos.shape[-1] dims (cos/sin broadcast against x[..., :R])."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    half = r // 2
    rot = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    return torch.cat((xr * cos + rot * sin, rest), dim=-1)


def rope_tables(shape: Qwen4ExpShape, positions: torch.Tensor, dtype):
    """cos, sin of shape [T, R] (HF: float32 math, then cast to the activation dtype)."""
    r = shape.rotary_dim
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32, device=positions.device) / r))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class HyperConnection(nn.Module):
    """Qwen4ExpTextGatedResidual: returns (x, inject) or, without inject weights (mixers), x alone."""

    def __init__(self, shape: Qwen4ExpShape, inject: bool = True):
        super().__init__()
        s, h = shape.hc_count, shape.hidden_size
        self.s, self.h = s, h
        self.hc_norm = OnePlusRMSNorm(s * h, shape.rms_norm_eps, group=h)
        self.input_mix_weight_down = linear(s * h, shape.hc_lowrank)
        self.input_mix_weight_up = linear(shape.hc_lowrank, s * h)
        self.block_inject_weight = linear(s * h, s) if inject else None

    def forward(self, big_x):
        xn = self.hc_norm(big_x)
        m = F.silu(self.input_mix_weight_down(xn) / self.s)
        gates = torch.sigmoid(self.input_mix_weight_up(m)).unflatten(-1, (self.s, self.h))
        x = (gates * xn.unflatten(-1, (self.s, self.h))).mean(dim=-2)
        if self.block_inject_weight is None:
            return x
        return x, 2 * torch.sigmoid(self.block_inject_weight(xn) / self.s)


# ------------------------------------------------------------------------------------------------------------
# Gated DeltaNet


def l2normalize(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunked_gated_delta(q, k, v, g, beta, chunk: int = 64):
    """q, k [B,T,Hv,dk]; v [B,T,Hv,dv]; g, beta [B,T,Hv]. Returns o [B,T,Hv,dv] in q's dtype (fp32 inside,
    also under autocast: the state recurrence is too sensitive for bf16 matmuls)."""
    with torch.autocast(q.device.type, enabled=False):
        return _chunked_gated_delta_f32(q, k, v, g, beta, chunk)


def _chunked_gated_delta_f32(q, k, v, g, beta, chunk):
    out_dtype = q.dtype
    bsz, seq, _, dk = k.shape
    q, k, v, g, beta = (t.transpose(1, 2).float() for t in (q, k, v, g, beta))
    q = l2normalize(q) * dk ** -0.5
    k = l2normalize(k)
    pad = (-seq) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (seq + pad) // chunk
    q, k, v = (t.unflatten(2, (n, chunk)) for t in (q, k, v))  # [B,H,n,C,d]
    g, beta = (t.unflatten(2, (n, chunk)) for t in (g, beta))  # [B,H,n,C]
    gam = g.cumsum(-1)
    keep = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(~keep, float("-inf")).exp()  # Γ, diag 1
    kb = k * beta[..., None]
    system = (kb @ k.transpose(-1, -2)) * decay  # unit-lower solve ignores its diagonal
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * gam.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * gam.exp()[..., None]
    k_dec = k * (gam[..., -1:] - gam).exp()[..., None]
    last = gam[..., -1].exp()[..., None, None]  # [B,H,n,1,1]
    state = q.new_zeros(bsz, q.shape[1], dk, v.shape[-1])
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        outs.append(q_dec[:, :, i] @ state + intra[:, :, i] @ v_new)
        state = state * last[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).flatten(2, 3)[:, :, :seq]
    return o.transpose(1, 2).to(out_dtype)


class GatedRMSNorm(nn.Module):
    """NG(o, z; w) = w * cast(o * rsqrt(mean(o^2)+eps)) * sigmoid(z_f32); plain w (initialised to 1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o, z):
        o32 = o.float()
        normed = (o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)).to(o.dtype)
        return (self.weight * normed * torch.sigmoid(z.float())).to(o.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        self.nk, self.nv = shape.linear_num_key_heads, shape.linear_num_value_heads
        self.dk, self.dv = shape.linear_key_head_dim, shape.linear_value_head_dim
        self.kd, self.vd = self.nk * self.dk, self.nv * self.dv
        conv_dim = 2 * self.kd + self.vd
        h = shape.hidden_size
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, shape.linear_conv_kernel_dim, groups=conv_dim, bias=False,
                                padding=shape.linear_conv_kernel_dim - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.empty(self.nv).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.dv, shape.rms_norm_eps)
        self.out_proj = linear(self.vd, h)
        self.in_proj_qkv = linear(h, conv_dim)
        self.in_proj_z = linear(h, self.vd)
        self.in_proj_b = linear(h, self.nv)
        self.in_proj_a = linear(h, self.nv)

    def forward(self, x):
        bsz, seq, _ = x.shape
        mixed = self.in_proj_qkv(x).transpose(1, 2)
        conv = F.conv1d(mixed, self.conv1d.weight, padding=self.conv1d.padding[0], groups=mixed.shape[1])
        mixed = F.silu(conv[..., :seq]).to(x.dtype).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.kd, self.kd, self.vd], dim=-1)
        q = q.reshape(bsz, seq, self.nk, self.dk)
        k = k.reshape(bsz, seq, self.nk, self.dk)
        v = v.reshape(bsz, seq, self.nv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        if self.nv > self.nk:  # V head h reads K head h // (nv/nk)  (HF's repeat_interleave)
            q = q.repeat_interleave(self.nv // self.nk, dim=2)
            k = k.repeat_interleave(self.nv // self.nk, dim=2)
        o = chunked_gated_delta(q, k, v, g, beta)
        z = self.in_proj_z(x).reshape(bsz, seq, self.nv, self.dv)
        return self.out_proj(self.norm(o, z).reshape(bsz, seq, self.vd))


# ------------------------------------------------------------------------------------------------------------
# QSA: gated attention with a block indexer


class QSAIndexer(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        self.ni, self.di = shape.indexer_n_heads, shape.indexer_head_dim
        self.ratio = shape.indexer_compress_ratio
        self.block_topk = shape.indexer_budget // shape.indexer_compress_ratio
        self.index_qk_proj = linear(shape.hidden_size, (self.ni + 1) * self.di)
        self.q_layernorm = OnePlusRMSNorm(self.di, shape.rms_norm_eps)
        self.k_layernorm = OnePlusRMSNorm(self.di, shape.rms_norm_eps)

    def block_scores(self, x, cos, sin):
        """Scores [B, T, nblocks] (float32) of every query against every complete block of the sequence."""
        bsz, seq, _ = x.shape
        qk = self.index_qk_proj(x)
        q = self.q_layernorm(qk[..., : self.ni * self.di].reshape(bsz, seq, self.ni, self.di))
        q = rotate(q, cos[:, None, :], sin[:, None, :])
        raw = qk[..., self.ni * self.di:]
        nblocks = seq // self.ratio
        if nblocks == 0:
            return None
        pooled = raw[:, : nblocks * self.ratio].unflatten(1, (nblocks, self.ratio)).float().mean(2).to(raw.dtype)
        starts = torch.arange(nblocks, device=x.device) * self.ratio
        keys = rotate(self.k_layernorm(pooled), cos[starts], sin[starts])
        scores = torch.einsum("bthd,bnd->btnh", q.float(), keys.float())
        return torch.relu(scores).sum(-1) / math.sqrt(self.di)

    def visible_blocks(self, seq: int, nblocks: int, device):
        """[T, nblocks]: block b is complete and visible to query p iff 4b+3 <= p (unpadded causal sequence)."""
        complete = (torch.arange(seq, device=device) + 1) // self.ratio
        return torch.arange(nblocks, device=device)[None, :] < complete[:, None]

    def token_mask(self, scores, seq: int, exact_selection: bool):
        """Allowed keys [B, T, T] (bool): causal AND (selected block or tail)."""
        device = scores.device if scores is not None else None
        pos = torch.arange(seq, device=device)
        causal = pos[None, :] <= pos[:, None]
        complete = (pos + 1) // self.ratio
        tail = pos[None, :] >= (complete * self.ratio)[:, None]
        if scores is None:
            return (causal & tail)[None]
        bsz, _, nblocks = scores.shape
        visible = self.visible_blocks(seq, nblocks, device)
        if exact_selection:
            chosen = torch.zeros(bsz, seq, nblocks, dtype=torch.bool, device=device)
            for b in range(bsz):
                for p in range(seq):
                    nb = int(complete[p])
                    if nb == 0:
                        continue
                    top = scores[b, p, :nb].topk(min(self.block_topk, nb), dim=0).indices
                    chosen[b, p, top] = True
        elif nblocks > self.block_topk:
            top = scores.masked_fill(~visible, float("-inf")).topk(self.block_topk, dim=-1).indices
            chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top, True) & visible
        else:
            chosen = visible.expand(bsz, -1, -1)
        block_of_token = (pos // self.ratio).clamp(max=nblocks - 1)
        return causal & (chosen[:, :, block_of_token] | tail)


class QSAttention(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        h, hd = shape.hidden_size, shape.head_dim
        self.nh, self.nkv, self.hd = shape.num_attention_heads, shape.num_key_value_heads, hd
        self.q_proj = linear(h, self.nh * hd * 2)
        self.k_proj = linear(h, self.nkv * hd)
        self.v_proj = linear(h, self.nkv * hd)
        self.o_proj = linear(self.nh * hd, h)
        self.q_norm = OnePlusRMSNorm(hd, shape.rms_norm_eps)
        self.k_norm = OnePlusRMSNorm(hd, shape.rms_norm_eps)
        self.indexer = QSAIndexer(shape)

    def forward(self, x, cos, sin, aux: dict, exact_selection: bool = False, indexer_loss: bool = False):
        bsz, seq, _ = x.shape
        index_input = x.detach() if indexer_loss else x
        scores = self.indexer.block_scores(index_input, cos, sin)
        with torch.no_grad():
            allowed = self.indexer.token_mask(None if scores is None else scores.detach(), seq, exact_selection)
        q, gate = self.q_proj(x).view(bsz, seq, self.nh, 2 * self.hd).chunk(2, dim=-1)
        q = rotate(self.q_norm(q), cos[:, None, :], sin[:, None, :]).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(bsz, seq, self.nkv, self.hd))
        k = rotate(k, cos[:, None, :], sin[:, None, :]).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq, self.nkv, self.hd).transpose(1, 2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        logits = (q @ k.transpose(-1, -2)) * self.hd ** -0.5  # [B, nh, T, T]
        probs = torch.softmax(logits.float().masked_fill(~allowed[:, None], float("-inf")), dim=-1)
        attn = (probs.to(q.dtype) @ v).transpose(1, 2).reshape(bsz, seq, self.nh * self.hd)
        if indexer_loss and scores is not None:
            aux.setdefault("indexer_kl", []).append(self._indexer_kl(logits.detach(), scores, seq))
        if "selected_fraction" in aux:
            aux["selected_fraction"].append(allowed.float().sum(-1).mean().item() / ((seq + 1) / 2))
        return self.o_proj(attn * torch.sigmoid(gate.reshape(bsz, seq, -1)))

    def _indexer_kl(self, logits, scores, seq):
        """KL(dense attention mass per block || softmax of the indexer's block scores), queries with >= 2 blocks."""
        ratio, nblocks = self.indexer.ratio, scores.shape[-1]
        pos = torch.arange(seq, device=logits.device)
        causal = pos[None, :] <= pos[:, None]
        dense = torch.softmax(logits.float().masked_fill(~causal, float("-inf")), dim=-1).mean(1)  # [B,T,T]
        mass = dense[..., : nblocks * ratio].unflatten(-1, (nblocks, ratio)).sum(-1)
        visible = self.indexer.visible_blocks(seq, nblocks, logits.device)
        target = mass.masked_fill(~visible, 0)
        target = target / target.sum(-1, keepdim=True).clamp_min(1e-9)
        logp = torch.log_softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        rows = visible.sum(-1) >= 2
        kl = (target * (torch.log(target.clamp_min(1e-9)) - logp.masked_fill(~visible, 0))).sum(-1)
        return kl[:, rows].mean()


# ------------------------------------------------------------------------------------------------------------
# MoE


class Router(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(shape.num_experts, shape.hidden_size))


class Experts(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        e, h, i = shape.num_experts, shape.hidden_size, shape.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))


class SharedExpert(nn.Module):
    def __init__(self, h: int, i: int):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(h, i), linear(h, i), linear(i, h)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        self.e, self.k, self.i = shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size
        self.gate = Router(shape)
        self.experts = Experts(shape)
        self.shared_expert = SharedExpert(shape.hidden_size, shape.shared_expert_intermediate_size)
        self.shared_expert_gate = linear(shape.hidden_size, 1)

    def forward(self, x, aux: dict):
        bsz, seq, h = x.shape
        flat = x.reshape(-1, h)
        router_logits = F.linear(flat, self.gate.weight)
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_w, top_i = torch.topk(probs, self.k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        dense_w = torch.zeros_like(probs).scatter(1, top_i, top_w).to(router_logits.dtype)
        gate_up = (flat @ self.experts.gate_up_proj.reshape(self.e * 2 * self.i, h).t()).view(-1, self.e, 2 * self.i)
        act = F.silu(gate_up[..., : self.i]) * gate_up[..., self.i:] * dense_w[..., None]
        down = self.experts.down_proj.permute(0, 2, 1).reshape(self.e * self.i, h)
        routed = act.reshape(-1, self.e * self.i) @ down
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        if "balance" in aux:
            load = torch.zeros_like(probs).scatter(1, top_i, 1.0).mean(0) / self.k  # share of assignments
            aux["balance"].append(self.e * (load.detach() * probs.mean(0)).sum())
        if "routing" in aux:
            aux["routing"].append((top_i.detach(), top_w.detach()))
        return (routed + shared).view(bsz, seq, h)


# ------------------------------------------------------------------------------------------------------------
# PLE n-gram embedding


MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64(v: int) -> int:
    v = (v + GAMMA) & MASK64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & MASK64
    return (v ^ (v >> 31)) & MASK64


def is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def ple_constants(shape: Qwen4ExpShape, ple_index: int):
    """(multipliers[n], head vocab sizes[16], head offsets[16], padded total rows) as reference §9 derives them."""
    half = max(1, ((1 << 63) - 1) // max(shape.vocab_size, 1) // 2)
    base = shape.seed + 10007 * ple_index
    mult = [2 * (splitmix64((base + GAMMA * (i + 1)) & MASK64) % half) + 1 for i in range(shape.ngram_size)]
    heads = (shape.ngram_size - 1) * shape.heads_per_ngram
    sizes, offsets, total, prime = [], [], 0, shape.ngram_vocab_size_base - 1
    for _ in range(ple_index * heads):  # earlier PLE layers use the earlier primes
        prime += 1
        while not is_prime(prime):
            prime += 1
    for _ in range(heads):
        prime += 1
        while not is_prime(prime):
            prime += 1
        sizes.append(prime)
        offsets.append(total)
        total += prime
    div = shape.make_ngram_vocab_size_divisible_by
    return mult, sizes, offsets, -(-total // div) * div


class NGramEmbedding(nn.Module):
    def __init__(self, shape: Qwen4ExpShape, ple_index: int):
        super().__init__()
        mult, sizes, offsets, rows = ple_constants(shape, ple_index)
        self.n, self.per_ngram, self.eos = shape.ngram_size, shape.heads_per_ngram, shape.eos_token_id
        self.register_buffer("layer_multipliers", torch.tensor(mult, dtype=torch.long))
        self.register_buffer("ngram_heads_vocab_sizes", torch.tensor(sizes, dtype=torch.long))
        self.register_buffer("ngram_heads_offsets", torch.tensor(offsets, dtype=torch.long))
        self.ngram_embedding = nn.Embedding(rows, shape.ple_embed_dim // len(sizes))

    def context(self, ids, shift: int):
        """c_shift[t] = ids[t-shift], or eos when t-shift < 0 or an EOS lies in positions t-shift .. t-1."""
        if shift == 0:
            return ids
        seq = ids.shape[1]
        pos = torch.arange(seq, device=ids.device)
        eos_at = torch.where(ids == self.eos, pos, -1)
        last_eos_before = torch.cat([eos_at.new_full((ids.shape[0], 1), -1),
                                     torch.cummax(eos_at, dim=1).values[:, :-1]], dim=1)
        src = pos - shift
        shifted = ids.gather(1, src.clamp_min(0).expand(ids.shape[0], -1))
        ok = (pos - last_eos_before - 1 >= shift) & (src >= 0)
        return torch.where(ok, shifted, torch.full_like(ids, self.eos))

    def forward(self, ids):
        ids = ids.long()
        hist = torch.cat([ids.new_full((ids.shape[0], self.n - 1), self.eos), ids], dim=1)
        ctx = [self.context(hist, s) for s in range(self.n)]
        rows, mixed = [], ctx[0] * self.layer_multipliers[0]
        for order in range(2, self.n + 1):
            mixed = torch.bitwise_xor(mixed, ctx[order - 1] * self.layer_multipliers[order - 1])
            lo = (order - 2) * self.per_ngram
            sizes = self.ngram_heads_vocab_sizes[lo: lo + self.per_ngram]
            offs = self.ngram_heads_offsets[lo: lo + self.per_ngram]
            rows.append(torch.remainder(mixed[..., None], sizes) + offs)
        rows = torch.cat(rows, dim=-1)[:, self.n - 1:]
        return self.ngram_embedding(rows).flatten(-2)


class PLELayer(nn.Module):
    def __init__(self, shape: Qwen4ExpShape, ple_index: int):
        super().__init__()
        s, h, d = shape.hc_count, shape.hidden_size, shape.ple_embed_dim
        self.s, self.h = s, h
        self.ple_embedding = NGramEmbedding(shape, ple_index)
        self.dilation = shape.ngram_size
        self.history = (shape.ple_conv_kernel_size - 1) * shape.ngram_size
        self.key_proj = linear(d, s * h)
        self.value_proj = linear(d, h)
        self.norm_key = OnePlusRMSNorm(s * h, shape.rms_norm_eps, group=h)
        self.norm_query = OnePlusRMSNorm(s * h, shape.rms_norm_eps, group=h)
        self.norm_conv = OnePlusRMSNorm(s * h, shape.rms_norm_eps, group=h)
        self.conv1d = nn.Conv1d(s * h, s * h, shape.ple_conv_kernel_size, groups=s * h,
                                dilation=shape.ngram_size, bias=False)
        nn.init.zeros_(self.conv1d.weight)

    def forward(self, big_x, ids):
        emb = self.ple_embedding(ids)
        key = self.norm_key(self.key_proj(emb)).unflatten(-1, (self.s, self.h))
        value = self.value_proj(emb)
        query = self.norm_query(big_x).unflatten(-1, (self.s, self.h))
        score = (key * query).sum(-1, keepdim=True) / math.sqrt(self.h)
        score = score.abs().clamp_min(1e-6).sqrt() * score.sign()
        gated = torch.sigmoid(score) * value.unsqueeze(-2)
        normed = self.norm_conv(gated.flatten(-2))
        conv_in = F.pad(normed.transpose(1, 2), (self.history, 0))
        conv = F.silu(F.conv1d(conv_in, self.conv1d.weight, dilation=self.dilation, groups=conv_in.shape[1]))
        return gated.flatten(-2) + conv.transpose(1, 2)


# ------------------------------------------------------------------------------------------------------------
# Decoder layer, trunk, MTP


class DecoderLayer(nn.Module):
    def __init__(self, shape: Qwen4ExpShape, layer_idx: int, allow_ple: bool = True):
        super().__init__()
        self.kind = shape.layer_types[layer_idx]
        if self.kind == LINEAR:
            self.linear_attn = GatedDeltaNet(shape)
        else:
            self.self_attn = QSAttention(shape)
        self.mlp = SparseMoe(shape)
        ple_ids = shape.ple_layer_ids if allow_ple else []
        self.ple = PLELayer(shape, ple_ids.index(layer_idx + 1)) if layer_idx + 1 in ple_ids else None
        self.attn_hyper_connection = HyperConnection(shape)
        self.mlp_hyper_connection = HyperConnection(shape)

    def forward(self, big_x, ids, cos, sin, aux, exact_selection=False, indexer_loss=False):
        if self.ple is not None:
            big_x = big_x + self.ple(big_x, ids)
        x, inject = self.attn_hyper_connection(big_x)
        if self.kind == LINEAR:
            y = self.linear_attn(x)
        else:
            y = self.self_attn(x, cos, sin, aux, exact_selection, indexer_loss)
        big_x = big_x + (y.unsqueeze(-2) * inject.unsqueeze(-1)).flatten(-2)
        x, inject = self.mlp_hyper_connection(big_x)
        y = self.mlp(x, aux)
        return big_x + (y.unsqueeze(-2) * inject.unsqueeze(-1)).flatten(-2)


class TextModel(nn.Module):
    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape, i) for i in range(shape.num_hidden_layers))
        self.hyper_connection_mixer = HyperConnection(shape, inject=False)


class MtpHead(nn.Module):
    """vLLM Qwen4ExpMultiTokenPredictor: fuse (h_t, token t+1) and run one QSA + MoE block at position t."""

    def __init__(self, shape: Qwen4ExpShape):
        super().__init__()
        h, s = shape.hidden_size, shape.hc_count
        self.h, self.s = h, s
        qsa = [i for i, t in enumerate(shape.layer_types) if t == QSA]
        self.trunk_layer_index = qsa[-1]
        self.fc_embedding = linear(h, h)
        self.fc_hidden = linear(h, h)
        self.pre_fc_norm_embedding = OnePlusRMSNorm(h, shape.rms_norm_eps)
        self.pre_fc_norm_hidden = OnePlusRMSNorm(s * h, shape.rms_norm_eps)  # ONE RMS over all S*H
        self.hyper_connection_mixer = HyperConnection(shape, inject=False)
        self.layers = nn.ModuleList([DecoderLayer(shape, self.trunk_layer_index, allow_ple=False)])


class Qwen4ExpTrainModel(nn.Module):
    def __init__(self, shape: Qwen4ExpShape, with_mtp: bool = True):
        super().__init__()
        self.shape = shape
        self.model = TextModel(shape)
        self.lm_head = linear(shape.hidden_size, shape.vocab_size)
        self.mtp = MtpHead(shape) if with_mtp else None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        std = self.shape.initializer_range
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 2)
            if any("norm" in part for part in leaf[-2:]):
                if name.endswith("linear_attn.norm.weight"):
                    p.fill_(1.0)
                else:
                    p.zero_()
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 16).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif name.endswith("ple.conv1d.weight"):
                p.zero_()
            elif name.endswith("linear_attn.conv1d.weight"):
                bound = 1 / math.sqrt(p.shape[-1])  # nn.Conv1d's default: fan_in = kernel for depthwise
                p.uniform_(-bound, bound)
            else:
                p.normal_(0.0, std)

    def trunk(self, ids, aux, exact_selection=False, indexer_loss=False):
        """Returns (premixer residual [B,T,S*H], logits [B,T,V])."""
        seq = ids.shape[1]
        e = self.model.embed_tokens(ids)
        cos, sin = rope_tables(self.shape, torch.arange(seq, device=ids.device), e.dtype)
        big_x = e.repeat(1, 1, self.shape.hc_count)
        for layer in self.model.layers:
            big_x = layer(big_x, ids, cos, sin, aux, exact_selection, indexer_loss)
        return big_x, self.lm_head(self.model.hyper_connection_mixer(big_x))

    def mtp_logits(self, premixer, next_ids, aux, exact_selection=False, indexer_loss=False):
        """Draft logits: row t fuses h_t (trunk residual before the mixer at t) with next_ids[t], position t."""
        head = self.mtp
        bsz, seq = next_ids.shape
        e = head.fc_embedding(head.pre_fc_norm_embedding(self.model.embed_tokens(next_ids)))
        hn = head.pre_fc_norm_hidden(premixer).unflatten(-1, (head.s, head.h))
        big_x = (e.unsqueeze(-2) + head.fc_hidden(hn)).flatten(-2)
        cos, sin = rope_tables(self.shape, torch.arange(seq, device=next_ids.device), e.dtype)
        big_x = head.layers[0](big_x, None, cos, sin, aux, exact_selection, indexer_loss)
        return self.lm_head(head.hyper_connection_mixer(big_x))
