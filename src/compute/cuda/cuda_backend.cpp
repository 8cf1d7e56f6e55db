// The CUDA backend. Contract in cuda_backend.h; the class is in cuda_backend_impl.h, the MoE layer
// in cuda_backend_moe.cpp.
#include "compute/cuda/cuda_backend_impl.h"

namespace strata::compute::cuda {
namespace detail {

static_assert(kChunkedDeltaRuleRows == kDeltaRuleChunkRows, "the CUDA and CPU chunked forms use the same chunks");

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet

void CudaBackend::gated_deltanet(const DeltaNetDims& hp, const GatedDeltaNetWeights& w, GatedDeltaNetState&, int layer,
                                 Tensor x, Tensor y, int64_t n_rows, bool record_window) {
  sign(Op::DeltaNet, x, y, layer, n_rows, record_window);
  if (replaying()) {  // the recorded graphs run the kernels; keep the rollback bookkeeping
    if (record_window) {
      deltanet_.at(layer).log_rows = n_rows;
      recorded_deltanet_.push_back(layer);
    }
    return;
  }
  std::optional<PendingHcCombine> fold = take_hc_combine(x, n_rows);  // before rows(), which would flush it
  const float* xd = rows(x, n_rows, "gated_deltanet");
  float* yd = rows(y, n_rows, "gated_deltanet", x.width);
  scratch_.reset();
  const int nk = hp.n_k_heads, nv = hp.n_v_heads;
  const int dk = hp.head_k_dim, dv = hp.head_v_dim, kernel = hp.conv_kernel;
  const int64_t key_dim = hp.key_dim(), value_dim = hp.value_dim(), conv_dim = hp.conv_dim();
  const size_t conv_bytes = size_t((kernel - 1) * conv_dim) * 4, ssm_bytes = size_t(nv) * dk * dv * 4;
  DeltaNetMirror& m = deltanet_[layer];
  if (!m.ssm.data()) {
    EagerScope eager(*this);
    m.conv = zeros(conv_bytes, s());
    m.ssm = zeros(ssm_bytes, s());
  }

  mark("dn.projections");
  float* mixed = scratch_.floats(n_rows * conv_dim);
  float* z = scratch_.floats(n_rows * value_dim);
  float* beta_raw = scratch_.floats(n_rows * nv);
  float* alpha_raw = scratch_.floats(n_rows * nv);
  // Short windows: conv and prepare in one launch (deltanet.h deltanet_conv_prepare), which also
  // reads the fused β/α rows itself (no split). The same bits as the two launches, so the choice
  // (by the window's rows) keeps window identity; STRATA_CUDA_DN_FUSED=0 keeps two, for A/B.
  const bool conv_prepare_fused =
      dn_conv_prepare_fused_ && deltanet_conv_prepare_supported(n_rows, nk, nv, dk, dv, kernel);
  float* ba = nullptr;
  if (w.fused_beta_alpha()) {
    ba = scratch_.floats(n_rows * 2 * nv);
    mm_shared(xd, n_rows, {{&w.qkv, mixed}, {&w.z, z}, {&w.beta_alpha, ba}}, nullptr, &fold);
    if (!conv_prepare_fused) split_beta_alpha(ba, n_rows, nk, nv / nk, beta_raw, alpha_raw, s());
  } else {
    mm_shared(xd, n_rows, {{&w.qkv, mixed}, {&w.z, z}, {&w.beta, beta_raw}, {&w.alpha, alpha_raw}}, nullptr, &fold);
  }

  // Prefill windows run the chunked form where enabled (chunked_deltanet_enabled) and the head dims
  // fit its shared memory; recorded (speculative verify) windows are shorter than the switch, and
  // their rollback replays the recurrent form, so they stay recurrent. The choice depends on the
  // window's rows and flag only: fixed per recorded graph.
  const bool chunked = chunked_deltanet_ && !record_window && n_rows >= kDeltaRuleChunkedMinRows &&
                       delta_rule_chunked_supported(dk, dv);
  float *q, *k, *v, *beta, *decay, *decay_log = nullptr;
  if (record_window) {
    if (m.log_capacity < n_rows) {
      EagerScope eager(*this);
      m.log_capacity = n_rows;
      m.ssm_before = DeviceBuffer(ssm_bytes);
      m.conv_before = DeviceBuffer(std::max<size_t>(conv_bytes, 4));
      m.conv_inputs = DeviceBuffer(size_t(n_rows * conv_dim) * 4);
      m.q = DeviceBuffer(size_t(n_rows * key_dim) * 4);
      m.k = DeviceBuffer(size_t(n_rows * key_dim) * 4);
      m.v = DeviceBuffer(size_t(n_rows * value_dim) * 4);
      m.beta = DeviceBuffer(size_t(n_rows * nv) * 4);
      m.decay = DeviceBuffer(size_t(n_rows * nv) * 4);
    }
    copy_d2d(m.ssm_before.data(), m.ssm.data(), ssm_bytes, s());
    copy_d2d(m.conv_before.data(), m.conv.data(), conv_bytes, s());
    copy_d2d(m.conv_inputs.data(), mixed, size_t(n_rows * conv_dim) * 4, s());
    m.log_rows = n_rows;
    recorded_deltanet_.push_back(layer);
    q = m.q.as<float>(), k = m.k.as<float>(), v = m.v.as<float>();
    beta = m.beta.as<float>(), decay = m.decay.as<float>();
  } else {
    q = scratch_.floats(n_rows * key_dim), k = scratch_.floats(n_rows * key_dim);
    v = scratch_.floats(n_rows * value_dim);
    beta = scratch_.floats(n_rows * nv), decay = scratch_.floats(n_rows * nv);
    if (chunked) decay_log = scratch_.floats(n_rows * nv);
  }
  mark("dn.conv+prepare");
  if (conv_prepare_fused) {
    deltanet_conv_prepare(mixed, n_rows, vec(w.conv), kernel, m.conv.as<float>(), ba ? nullptr : beta_raw,
                          ba ? nullptr : alpha_raw, ba, vec(w.a), vec(w.dt_bias), nk, nv, dk, dv, q, k, v, beta, decay,
                          decay_log, s());
  } else {
    float* conv_out = scratch_.floats(n_rows * conv_dim);
    deltanet_conv_silu(mixed, n_rows, conv_dim, vec(w.conv), kernel, m.conv.as<float>(), conv_out, s());
    deltanet_prepare(conv_out, beta_raw, alpha_raw, vec(w.a), vec(w.dt_bias), n_rows, nk, nv, dk, dv, q, k, v, beta,
                     decay, decay_log, s());
  }
  float* core = scratch_.floats(n_rows * value_dim);
  if (chunked) {
    mark("dn.chunked");
    delta_rule_chunked(q, k, v, beta, decay_log, n_rows, nk, nv, dk, dv, hp.v_heads_tiled, m.ssm.as<float>(), core,
                       s());
  } else {
    mark("dn.recurrent");
    delta_rule_recurrent(q, k, v, beta, decay, n_rows, nk, nv, dk, dv, hp.v_heads_tiled, m.ssm.as<float>(), core,
                         s());
  }
  mark("dn.norm+gate+out");
  const ActivationLayout out_layout = activation_layout(w.out.type, value_dim, n_rows);
  if (can_norm_quantize(out_layout, nv, dv) && out_layout.format != GgmlType::F32) {
    // The norm, the gate and the out projection's quantizer in one launch (the same bits).
    void* act = scratch_.take(out_layout.total_bytes);
    rms_norm_gate_quantize_activations(out_layout, core, vec(w.norm), nv, dv, hp.rms_eps, z, hp.gate_sigmoid, act, s());
    matmul_quantized(matrix(w.out), out_layout, act, n_rows, yd, s());
  } else {
    rms_norm_rows(core, vec(w.norm), n_rows * nv, dv, hp.rms_eps, core, s());
    gate_rows(core, z, n_rows * value_dim, hp.gate_sigmoid, s());
    mm(w.out, core, n_rows, yd);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention (plain, gated, QSA)

KvMirror& CudaBackend::kv_mirror(const AttentionDims& hp, const AttentionWeights& w, int layer, int64_t n_tokens) {
  KvMirror& kv = kv_[layer];
  if (kv.capacity >= n_tokens) return kv;
  EagerScope eager(*this);
  const int64_t kv_dim = hp.kv_dim(), di = hp.indexer_head_dim;
  const int64_t capacity = std::max<int64_t>({n_tokens, 2 * kv.capacity, 256});
  const size_t keep_tokens = size_t(kv.capacity);
  grow(kv.k, size_t(capacity * kv_dim) * 4, keep_tokens * kv_dim * 4, s());
  grow(kv.v, size_t(capacity * kv_dim) * 4, keep_tokens * kv_dim * 4, s());
  if (w.sparse()) {
    grow(kv.index_raw, size_t(capacity * di) * 4, keep_tokens * di * 4, s());
    grow(kv.block_keys, size_t(capacity / w.compress_ratio + 1) * di * 4,
         size_t(kv.blocks_done * di) * 4, s());
  }
  kv.capacity = capacity;
  return kv;
}

void CudaBackend::attention(const AttentionDims& hp, const AttentionWeights& w, KvCache& cache, int layer, Tensor x,
                            Tensor y, int64_t n_rows) {
  sign(Op::Attention, x, y, layer, n_rows);
  const int64_t first = cache.n_tokens;
  if (replaying()) {
    // describe_window checked capacity, blocks and budget; stage the inputs in the recorded
    // order (the window's first position, then its positions).
    KvMirror& kv = kv_.at(layer);
    if (kv.first_in_window < 0) kv.first_in_window = first;
    upload_ints({int32_t(first)});
    positions(first, n_rows);
    if (w.sparse()) kv.blocks_done = (first + n_rows) / w.compress_ratio;
    cache.n_tokens += n_rows;
    return;
  }
  std::optional<PendingHcCombine> fold = take_hc_combine(x, n_rows);  // before rows(), which would flush it
  const float* xd = rows(x, n_rows, "attention");
  float* yd = rows(y, n_rows, "attention", x.width);
  scratch_.reset();
  const int hd = hp.head_dim, n_head = hp.n_head, n_head_kv = hp.n_head_kv;
  const int64_t q_row = int64_t(n_head) * hd * (w.gated ? 2 : 1), kv_dim = hp.kv_dim();
  if (first + n_rows > kMaxAttentionTokens)
    fail("cuda backend: attention: {} tokens exceed the CUDA attention's limit of {} for now", first + n_rows,
         kMaxAttentionTokens);
  KvMirror& kv = kv_mirror(hp, w, layer, first + n_rows);
  if (kv.first_in_window < 0) kv.first_in_window = first;

  // The window's first position as a device word, so a replayed graph appends and attends at
  // this window's n_past (the kernels read it when they run); staged first, then the positions.
  const int32_t* first_device = upload_ints({int32_t(first)});
  const int32_t* pos = positions(first, n_rows);
  const int q_stride = w.gated ? 2 * hd : hd;

  // Every projection of x in one launch where the types allow (mm_shared), the QSA indexer's too.
  mark("attn.projections");
  float* q = scratch_.floats(n_rows * q_row);
  float* k = scratch_.floats(n_rows * kv_dim);
  float* v = scratch_.floats(n_rows * kv_dim);
  const int di = hp.indexer_head_dim, n_idx = hp.indexer_n_head, ratio = w.sparse() ? w.compress_ratio : 1;
  float* index_q = w.sparse() ? scratch_.floats(n_rows * n_idx * di) : nullptr;
  float* raw = w.sparse() ? scratch_.floats(n_rows * di) : nullptr;
  if (w.sparse())
    mm_shared(xd, n_rows, {{&w.q, q}, {&w.k, k}, {&w.v, v}, {&w.index_q, index_q}, {&w.index_k, raw}}, nullptr, &fold);
  else
    mm_shared(xd, n_rows, {{&w.q, q}, {&w.k, k}, {&w.v, v}}, nullptr, &fold);

  // QSA's indexer (its keys, the block keys, the selection) does not depend on q, k, v: a side
  // branch (side_branch) beside the heads' norms, RoPE and KV append, joined before the core. Its
  // scratch and weights are taken before the fork.
  int32_t* token_lists = nullptr;
  int32_t* token_counts = nullptr;
  int max_tokens = 0;
  const float* q_norm = vec(w.q_norm);
  const float* k_norm = vec(w.k_norm);
  if (w.sparse()) {
    mark("attn.qsa");
    const float* index_q_norm = vec(w.index_q_norm);
    const float* index_k_norm = vec(w.index_k_norm);
    // Blocks completed by this window: κ_b = RoPE_{ratio·b}(N1p(mean of the block's raw keys)),
    // found on the device from the window's first position (blocks before it are done).
    if (kv.blocks_done != first / ratio)
      fail("cuda backend: attention layer {}: QSA block keys cover {} blocks at position {}, expected {}", layer,
           kv.blocks_done, first, first / ratio);
    const int64_t total_blocks = (first + n_rows) / ratio;
    kv.blocks_done = total_blocks;
    // The last row has the most blocks: when it is within budget, every row attends densely.
    // Otherwise the device scores the blocks and selects each row's tokens: launch shapes
    // depend only on the window's attention bound, so a replayed window selects for any n_past.
    const int64_t budget_blocks = hp.indexer_top_k / ratio;
    const bool selecting = total_blocks > budget_blocks;
    const int64_t max_blocks = attention_bound(first + n_rows) / ratio;
    float* scores = nullptr;
    if (selecting) {
      max_tokens = int((budget_blocks + 1) * ratio - 1);
      scores = scratch_.floats(n_rows * max_blocks);
      token_lists = scratch_.ints(n_rows * max_tokens);
      token_counts = scratch_.ints(n_rows);
    }
    side_branch([&](cudaStream_t side) {
      rms_norm_strided(index_q, index_q_norm, n_rows * n_idx, di, di, hp.rms_eps, index_q, side);
      rope_neox_rows(index_q, n_rows, n_idx, di, hp.n_rot, pos, hp.rope_theta, side);
      append_rows_at(raw, n_rows, di, first_device, kv.index_raw.as<float>(), side);
      qsa_block_keys_at(kv.index_raw.as<float>(), first_device, n_rows, ratio, di, index_k_norm, hp.rms_eps, hp.n_rot,
                        hp.rope_theta, kv.block_keys.as<float>(), side);
      if (selecting) {
        const float scale = 1.0f / std::sqrt(float(di));
        qsa_block_scores_at(index_q, n_rows, n_idx, di, kv.block_keys.as<float>(), first_device, ratio, max_blocks,
                            scale, scores, side);
        qsa_select_tokens(scores, n_rows, max_blocks, first_device, ratio, budget_blocks, max_tokens, token_lists,
                          token_counts, side);
      }
    });
  }

  mark("attn.norm+rope+append");
  if (q_norm) rms_norm_strided(q, q_norm, n_rows * n_head, hd, q_stride, hp.rms_eps, q, s());
  rope_neox_strided(q, n_rows, q_row, n_head, q_stride, hd, hp.n_rot, pos, hp.rope_theta, s());
  if (k_norm) rms_norm_strided(k, k_norm, n_rows * n_head_kv, hd, hd, hp.rms_eps, k, s());
  rope_neox_rows(k, n_rows, n_head_kv, hd, hp.n_rot, pos, hp.rope_theta, s());
  append_rows_at(k, n_rows, kv_dim, first_device, kv.k.as<float>(), s());
  append_rows_at(v, n_rows, kv_dim, first_device, kv.v.as<float>(), s());
  join_side();

  mark("attn.core");
  float* attn = scratch_.floats(n_rows * n_head * hd);
  const AttentionShape shape{n_head, n_head_kv, hd, w.gated, q_row, kv_dim};
  const int64_t bound = attention_bound(first + n_rows);
  // The split form's per-split partials (attention.h): sized by the launch's bound, not by this
  // window's tokens, so the recorded launch serves every n_past up to the bound.
  const int64_t partial_floats =
      attention_partial_floats(shape, n_rows, token_lists ? std::max<int64_t>(max_tokens, bound) : bound);
  float* partials = partial_floats > 0 ? scratch_.floats(partial_floats) : nullptr;
  attention_rows_at(shape, q, n_rows, kv.k.as<float>(), kv.v.as<float>(), first_device, bound, token_lists,
                    token_counts, max_tokens, partials, attn, s());
  mark("attn.out");
  mm(w.o, attn, n_rows, yd);
  cache.n_tokens += n_rows;
}

// ---------------------------------------------------------------------------------------------
// PLE

void CudaBackend::ple(const PleDims& hp, const PleWeights& w, PleState& state, PleRowReader& reader, Tensor X,
                      int64_t n_rows, bool record_window) {
  sign(Op::Ple, X, n_rows, record_window);
  PleWindowLog& log = state.window_log;
  log.valid = false;
  if (record_window) {
    ple_.log_rows = n_rows;
    ple_.recorded = true;
    log.valid = true;
    log.context_before = state.context;
    log.n_rows = n_rows;
  }
  if (replaying()) {  // stage this window's rows where the recorded copy reads them
    const std::vector<float>& embeddings = reader.collect();
    upload(nullptr, embeddings.data(), embeddings.size() * 4);
    return;
  }
  float* Xd = rows(X, n_rows, "ple");
  mark("ple");
  scratch_.reset();
  const int S = hp.n_streams, kernel = hp.conv_kernel, dilation = hp.ngram_size;
  const int64_t H = hp.n_embd, width = S * H, history_steps = int64_t(kernel - 1) * dilation;
  const size_t history_bytes = size_t(std::max<int64_t>(history_steps, 1) * width) * 4;
  if (!ple_.history.data()) {
    EagerScope eager(*this);
    ple_.history = zeros(history_bytes, s());
    ple_.next = zeros(history_bytes, s());
    ple_.before = zeros(history_bytes, s());
  }
  const std::vector<float>& embeddings = reader.collect();
  const int64_t e_width = int64_t(embeddings.size()) / std::max<int64_t>(n_rows, 1);
  float* E = scratch_.floats(n_rows * e_width);
  upload(E, embeddings.data(), embeddings.size() * 4);

  float* keys = scratch_.floats(n_rows * width);
  float* values = scratch_.floats(n_rows * H);
  mm_shared(E, n_rows, {{&w.key, keys}, {&w.value, values}});
  rms_norm_grouped_rows(keys, vec(w.norm_key), n_rows, S, H, hp.rms_eps, keys, s());
  float* query = scratch_.floats(n_rows * width);
  rms_norm_grouped_rows(Xd, vec(w.norm_query), n_rows, S, H, hp.rms_eps, query, s());
  float* gated = scratch_.floats(n_rows * width);
  ple_gate(keys, query, values, n_rows, S, H, gated, s());
  float* normed;
  if (record_window) {
    if (ple_.normed_capacity < n_rows) {
      EagerScope eager(*this);
      ple_.normed = DeviceBuffer(size_t(n_rows * width) * 4);
      ple_.normed_capacity = n_rows;
    }
    normed = ple_.normed.as<float>();
  } else {
    normed = scratch_.floats(n_rows * width);
  }
  rms_norm_grouped_rows(gated, vec(w.norm_conv), n_rows, S, H, hp.rms_eps, normed, s());
  ple_conv(normed, ple_.history.as<float>(), vec(w.conv), gated, n_rows, width, kernel, dilation, Xd, s());
  history_tail(ple_.history.as<float>(), normed, n_rows, history_steps, width, ple_.next.as<float>(), s());
  // Copied, not swapped, so the buffers a recorded graph names stay the same from window to
  // window: the log keeps the history from before the window, then the new one takes its place.
  if (record_window) copy_d2d(ple_.before.data(), ple_.history.data(), history_bytes, s());
  copy_d2d(ple_.history.data(), ple_.next.data(), history_bytes, s());
}

// ---------------------------------------------------------------------------------------------
// Rollback

bool CudaBackend::rollback_window(int64_t keep_rows) {
  flush_deferred();
  if (!hp_) return true;  // nothing ran yet
  const ForwardDims& hp = *hp_;
  for (const int layer : recorded_deltanet_) {
    DeltaNetMirror& m = deltanet_.at(layer);
    if (keep_rows < 0 || keep_rows > m.log_rows)
      fail("cuda backend: rollback: cannot keep {} rows of a {}-row window", keep_rows, m.log_rows);
    if (keep_rows == m.log_rows) continue;
    const int nk = hp.deltanet.n_k_heads, nv = hp.deltanet.n_v_heads;
    const int dk = hp.deltanet.head_k_dim, dv = hp.deltanet.head_v_dim;
    const int64_t conv_dim = hp.deltanet.conv_dim();
    history_tail(m.conv_before.as<float>(), m.conv_inputs.as<float>(), keep_rows, hp.deltanet.conv_kernel - 1, conv_dim,
                 m.conv.as<float>(), s());
    copy_d2d(m.ssm.data(), m.ssm_before.data(), size_t(nv) * dk * dv * 4, s());
    if (keep_rows > 0)
      delta_rule_recurrent(m.q.as<float>(), m.k.as<float>(), m.v.as<float>(), m.beta.as<float>(),
                           m.decay.as<float>(), keep_rows, nk, nv, dk, dv, hp.deltanet.v_heads_tiled, m.ssm.as<float>(),
                           nullptr, s());
  }
  recorded_deltanet_.clear();
  for (auto& [layer, kv] : kv_) {
    if (kv.first_in_window < 0) continue;
    const int ratio = hp.compress_ratios.empty() ? 0 : hp.compress_ratios[size_t(layer)];
    if (ratio > 0) kv.blocks_done = std::min(kv.blocks_done, (kv.first_in_window + keep_rows) / ratio);
    kv.first_in_window = -1;
  }
  if (ple_.recorded && keep_rows < ple_.log_rows) {
    const int64_t width = int64_t(hp.ple.n_streams) * hp.ple.n_embd;
    const int64_t history_steps = int64_t(hp.ple.conv_kernel - 1) * hp.ple.ngram_size;
    history_tail(ple_.before.as<float>(), ple_.normed.as<float>(), keep_rows, history_steps, width,
                 ple_.history.as<float>(), s());
  }
  ple_.recorded = false;
  return true;
}

}  // namespace detail

using detail::CudaBackend;

std::unique_ptr<Backend> make_cuda_backend(BackendShared& shared) { return std::make_unique<CudaBackend>(shared); }

GpuTierInfo gpu_tier_info(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (!cuda) return {};
  return cuda->tier_info();
}

int gpu_tier_pin_prompt_hot(Backend& backend, const HotPinOptions& options, const UsageHistory* history) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  GpuExpertTier* tier = cuda ? cuda->expert_tier_if_any() : nullptr;
  return tier ? tier->pin_prompt_hot(options, history) : 0;
}

void gpu_tier_reset_prompt_heat(Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (GpuExpertTier* tier = cuda ? cuda->expert_tier_if_any() : nullptr) tier->reset_prompt_heat();
}

GraphCounters graph_counters(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (!cuda) return {};
  const WindowGraphStats& g = cuda->graph_stats();
  GraphCounters c{g.windows, g.replays, g.records, g.forgotten};
  c.replay_host_before_s = g.replay_host_before_s;
  c.replays_launched = g.replays_launched;
  return c;
}

void register_cuda_backend() {
  register_backend(BackendEntry{"cuda", [] { return usable_device(); }, [] { return describe_device(); },
                                [](BackendShared& shared) { return make_cuda_backend(shared); }});
}

}  // namespace strata::compute::cuda
