"""qwen4exp checkpoint plumbing for tools/train_default_model.py: the config (HF field names), HF checkpoint names,
and a dependency-free safetensors reader/writer.

  * `Qwen4ExpShape`: the `Qwen4ExpTextConfig` fields the training module uses; `hf_config_kwargs()` builds the HF
    config, `from_hf_config()` reads a saved config.json.
  * `trunk_state_dict()` / `mtp_saved_tensors()`: the tensors under HF run-time names (strict-loadable into
    `Qwen4ExpForCausalLM`) and the MTP head under the names llama.cpp's converter and strata read (`mtp.*`).
  * `saved_format_tensors()` / `load_saved_checkpoint()`: HF's *saved* layout (per-expert routed experts,
    `ngram_embedding.shard_<i>` PLE shards, int64 PLE buffers) to and from the module; used where transformers is
    not installed (the dev box), and checked against transformers' own `save_pretrained` on the training box.
  * `st_load` / `st_save`: safetensors files (F32, F16, BF16, I64, I32) without the `safetensors` package.
Errors are raised as RuntimeError/ValueError naming the tensor and the expected/found shapes.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

QSA = "qwen_sparse_attention"
LINEAR = "linear_attention"


@dataclass
class Qwen4ExpShape:
    """The HF `Qwen4ExpTextConfig` fields this module uses (same names, same meaning)."""

    vocab_size: int = 6144
    hidden_size: int = 256
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 1.0e7
    partial_rotary_factor: float = 0.25
    mrope_section: list = field(default_factory=lambda: [3, 3, 2])
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    num_experts: int = 64
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 128
    hc_count: int = 4
    hc_lowrank: int = 32
    ple_layer_ids: list = field(default_factory=lambda: [2])
    ple_embed_dim: int = 256
    ple_conv_kernel_size: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_vocab_size_base: int = 5000
    make_ngram_vocab_size_divisible_by: int = 64
    seed: int = 1234
    split_ngram_parts: int = 2
    indexer_n_heads: int = 2
    indexer_kv_heads: int = 1
    indexer_head_dim: int = 32
    indexer_budget: int = 64
    indexer_compress_ratio: int = 4
    eos_token_id: int = 0
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    max_position_embeddings: int = 4096
    full_attention_interval: int = 4
    layer_types: list | None = None

    def __post_init__(self):
        if self.layer_types is None:
            self.layer_types = [LINEAR if (i + 1) % self.full_attention_interval else QSA
                                for i in range(self.num_hidden_layers)]
        self.layer_types = [QSA if t in ("full_attention", QSA) else t for t in self.layer_types]
        if set(self.layer_types) - {LINEAR, QSA}:
            raise ValueError(f"layer_types: unsupported {sorted(set(self.layer_types) - {LINEAR, QSA})}")
        rotary = int(self.head_dim * self.partial_rotary_factor)
        if sum(self.mrope_section) * 2 != rotary:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to rotary_dim/2 = {rotary // 2}")
        if rotary > self.indexer_head_dim:
            raise ValueError(f"rotary dim {rotary} > indexer_head_dim {self.indexer_head_dim}")
        if self.indexer_budget % self.indexer_compress_ratio:
            raise ValueError("indexer_budget must be a multiple of indexer_compress_ratio")
        if self.ple_embed_dim % ((self.ngram_size - 1) * self.heads_per_ngram):
            raise ValueError("ple_embed_dim must be a multiple of (ngram_size-1)*heads_per_ngram")
        for layer_id in self.ple_layer_ids:
            if self.layer_types[layer_id - 1] != LINEAR:
                raise ValueError(f"PLE layer {layer_id} (1-based) must be a linear-attention layer")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def hf_config_kwargs(self) -> dict:
        """Keyword arguments for transformers' Qwen4ExpTextConfig."""
        out = asdict(self)
        for name in ("rope_theta", "partial_rotary_factor", "mrope_section", "full_attention_interval"):
            out.pop(name)
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                  "partial_rotary_factor": self.partial_rotary_factor,
                                  "mrope_section": list(self.mrope_section), "mrope_interleaved": True}
        out["output_gate_type"] = "sigmoid"
        out["tie_word_embeddings"] = False
        out["norm_topk_prob"] = True
        out["hidden_act"] = "silu"
        return out

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "Qwen4ExpShape":
        rope = cfg.get("rope_parameters") or {}
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in cfg.items() if k in known and k not in ("rope_theta", "partial_rotary_factor",
                                                                          "mrope_section")}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs, rope_theta=rope.get("rope_theta", 1e7),
                   partial_rotary_factor=rope.get("partial_rotary_factor", 1.0),
                   mrope_section=list(rope.get("mrope_section", [11, 11, 10])))


    def hf_config_json(self, with_mtp: bool = True) -> dict:
        """config.json as transformers 5.17's save_pretrained writes it (plus mtp_num_hidden_layers)."""
        out = self.hf_config_kwargs()
        out.update({"architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text", "dtype": "bfloat16",
                    "attention_bias": False, "attention_dropout": 0.0, "use_cache": True})
        if with_mtp:
            out["mtp_num_hidden_layers"] = 1
        return out


# ------------------------------------------------------------------------------------------------------------
# safetensors without the package

ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
             "I32": torch.int32}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def st_load(path) -> dict:
    data = Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + header_len])
    base, out = 8 + header_len, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = bytearray(data[base + begin: base + end])
        dtype = ST_DTYPES[info["dtype"]]
        tensor = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = tensor.reshape(info["shape"]).clone()
    return out


def st_load_dir(directory) -> dict:
    tensors = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(st_load(file))
    return tensors


def st_save(tensors: dict, path) -> None:
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in ST_NAMES:
            raise ValueError(f"tensor {name}: unsupported dtype {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in chunks:
            f.write(raw)


# ------------------------------------------------------------------------------------------------------------
# Names


def trunk_state_dict(model: Qwen4ExpTrainModel) -> dict:
    """The trunk's tensors under HF run-time names (for Qwen4ExpForCausalLM.load_state_dict)."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}


def mtp_saved_tensors(model: Qwen4ExpTrainModel, trunk_saved_keys) -> dict:
    """mtp.* tensors in the trunk's *saved* key format (per-expert routed experts when HF saves them so)."""
    head = model.mtp
    out = {}
    for name in ("fc_embedding", "fc_hidden", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        out[f"mtp.{name}.weight"] = getattr(head, name).weight.detach().clone()
    for key, value in head.hyper_connection_mixer.state_dict().items():
        out[f"mtp.hyper_connection_mixer.{key}"] = value.detach().clone()
    prefix = f"model.layers.{head.trunk_layer_index}."
    suffixes = sorted(k[len(prefix):] for k in trunk_saved_keys if k.startswith(prefix))
    layer = head.layers[0].state_dict()
    inter = model.shape.moe_intermediate_size
    for suffix in suffixes:
        if suffix in layer:
            out[f"mtp.layers.0.{suffix}"] = layer[suffix].detach().clone()
            continue
        parts = suffix.split(".")  # mlp.experts.<e>.<gate|up|down>_proj.weight
        if len(parts) != 5 or parts[:2] != ["mlp", "experts"] or parts[4] != "weight":
            raise RuntimeError(f"MTP export: no tensor for trunk key suffix {suffix}")
        expert, which = int(parts[2]), parts[3]
        if which == "down_proj":
            out[f"mtp.layers.0.{suffix}"] = layer["mlp.experts.down_proj"][expert].clone()
        elif which in ("gate_proj", "up_proj"):
            fused = layer["mlp.experts.gate_up_proj"][expert]
            out[f"mtp.layers.0.{suffix}"] = (fused[:inter] if which == "gate_proj" else fused[inter:]).clone()
        else:
            raise RuntimeError(f"MTP export: unexpected expert tensor {suffix}")
    return out


def load_saved_checkpoint(model: Qwen4ExpTrainModel, tensors: dict, check_ple_constants: bool = True) -> None:
    """Loads an HF *saved* checkpoint (per-expert experts, PLE shards, optional mtp.*) into the module. The int64
    PLE buffers must equal the ones the config derives unless check_ple_constants is False (then the file's win)."""
    shape = model.shape
    own = model.state_dict()
    merged: dict = {}
    experts: dict = {}
    shards: dict = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            at = parts.index("experts")
            experts.setdefault(".".join(parts[: at + 1]), {})[(int(parts[at + 1]), parts[at + 2])] = value
        elif ".ngram_embedding.shard_" in key:
            base = key.split(".shard_")[0]
            shards.setdefault(base, {})[int(key.split(".shard_")[1].split(".")[0])] = value
        else:
            merged[key] = value
    for base, per in experts.items():
        n = shape.num_experts
        merged[base + ".gate_up_proj"] = torch.stack(
            [torch.cat([per[(e, "gate_proj")], per[(e, "up_proj")]], 0) for e in range(n)])
        merged[base + ".down_proj"] = torch.stack([per[(e, "down_proj")] for e in range(n)])
    for base, per in shards.items():
        merged[base + ".weight"] = torch.cat([per[i] for i in sorted(per)], 0)
    missing = sorted(set(own) - set(merged))
    unexpected = sorted(set(merged) - set(own))
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for key, value in merged.items():
        if tuple(own[key].shape) != tuple(value.shape):
            raise RuntimeError(f"{key}: shape {tuple(value.shape)} != expected {tuple(own[key].shape)}")
        if check_ple_constants and own[key].dtype == torch.long and not torch.equal(own[key], value.long()):
            raise RuntimeError(f"{key}: PLE constants differ from the config's ({value.tolist()})")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in merged.items()}, strict=True)


def saved_format_tensors(model, dtype=torch.bfloat16) -> dict:
    """The whole checkpoint (trunk + mtp.*) in HF 5.17's saved layout: routed experts per expert
    (`mlp.experts.<e>.{gate,up,down}_proj.weight`), the PLE table as `split_ngram_parts` row shards, int64 buffers
    kept int64, everything else cast to `dtype`."""
    shape = model.shape
    out = {}
    for key, value in trunk_state_dict(model).items():
        value = value.detach().cpu()
        if value.dtype.is_floating_point:
            value = value.to(dtype)
        if key.endswith("mlp.experts.gate_up_proj"):
            base, inter = key[: -len("gate_up_proj")], shape.moe_intermediate_size
            for e in range(value.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = value[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = value[e, inter:].clone()
        elif key.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = value[e].clone()
        elif key.endswith("ngram_embedding.weight"):
            base = key[: -len("weight")]
            for i, part in enumerate(value.chunk(shape.split_ngram_parts, dim=0)):
                out[f"{base}shard_{i}.weight"] = part.clone()
        else:
            out[key] = value
    if model.mtp is not None:
        for key, value in mtp_saved_tensors(model, set(out)).items():
            out[key] = value.to(dtype) if value.dtype.is_floating_point else value
    return out
