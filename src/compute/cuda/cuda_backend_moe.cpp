// The CUDA backend's MoE layer: router, top-k, the routed experts from the all-resident arena or
// the GPU expert tier (expert_tier.h), the shared expert, the combine. Class in cuda_backend_impl.h.
#include "compute/cuda/cuda_backend_impl.h"

namespace strata::compute::cuda::detail {

// ---------------------------------------------------------------------------------------------
// MoE

LayerExperts& CudaBackend::layer_experts(const MoeDims& hp, ExpertSource& source, int layer) {
  std::lock_guard lock(weights_->mutex);
  auto it = weights_->experts.find(layer);
  if (it != weights_->experts.end()) return it->second;
  EagerScope eager(*this);
  const int n_expert = hp.n_expert;
  std::vector<int32_t> all(static_cast<size_t>(n_expert));
  std::iota(all.begin(), all.end(), 0);
  source.publish(layer, all);
  LayerExperts le;
  std::vector<char> seen(static_cast<size_t>(n_expert), 0);
  int handed = 0;
  size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;
  for_each_delivered(source, [&](int index, const ExpertMatrices& m) {
    if (index < 0 || index >= n_expert || seen[size_t(index)])
      fail(
          "cuda backend: layer {}: the expert source delivered index {} (of {}) twice or out of "
          "range",
          layer, index, n_expert);
    seen[size_t(index)] = 1;
    if (handed == 0) {
      gate_bytes = size_t(m.gate.n_out) * m.gate.row_stride_bytes;
      up_bytes = size_t(m.up.n_out) * m.up.row_stride_bytes;
      down_bytes = size_t(m.down.n_out) * m.down.row_stride_bytes;
      const size_t up_offset = align_up(gate_bytes, 16), down_offset = up_offset + align_up(up_bytes, 16);
      const size_t slot = align_up(down_offset + down_bytes, 256);
      le.gate = {m.gate.type, m.gate.n_in, m.gate.n_out, 0, m.gate.row_stride_bytes};
      le.up = {m.up.type, m.up.n_in, m.up.n_out, up_offset, m.up.row_stride_bytes};
      le.down = {m.down.type, m.down.n_in, m.down.n_out, down_offset, m.down.row_stride_bytes};
      le.arena = DeviceBuffer(slot * size_t(n_expert));
      le.view.slot_bytes = slot;
    }
    uint8_t* dst = le.arena.as<uint8_t>() + size_t(index) * le.view.slot_bytes;
    STRATA_CUDA_CHECK(cudaMemcpy(dst, m.gate.data, gate_bytes, cudaMemcpyHostToDevice));
    STRATA_CUDA_CHECK(cudaMemcpy(dst + le.up.matrix_offset, m.up.data, up_bytes, cudaMemcpyHostToDevice));
    STRATA_CUDA_CHECK(cudaMemcpy(dst + le.down.matrix_offset, m.down.data, down_bytes, cudaMemcpyHostToDevice));
    ++handed;
  });
  // The copies above are on the legacy stream and may return before their DMA ends (see
  // DeviceBuffer::upload); this backend's stream is non-blocking: wait for them.
  STRATA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  if (handed != n_expert)
    fail("cuda backend: layer {}: the expert source delivered {} of {} experts", layer, handed,
         n_expert);
  std::vector<uint32_t> identity(static_cast<size_t>(n_expert));
  std::iota(identity.begin(), identity.end(), 0u);
  le.smap = DeviceBuffer(identity.size() * 4);
  le.smap.upload(identity.data(), identity.size() * 4);
  le.view.base = le.arena.as<uint8_t>();
  le.view.smap = le.smap.as<uint32_t>();
  le.view.n_expert = n_expert;
  return weights_->experts.emplace(layer, std::move(le)).first->second;
}

GpuExpertTier* CudaBackend::expert_tier(const MoeDims& hp, int64_t max_rows, ExpertSource& source) {
  std::lock_guard lock(weights_->mutex);
  if (weights_->tier_decided) return weights_->tier.get();
  weights_->tier_decided = true;
  if (!tier_options_.tiered()) return nullptr;
  if (tier_options_.layers.empty())
    fail("cuda backend: a GPU expert budget was set without the model's expert layouts (BackendShared::gpu_tier)");
  // A budget that buys a slot for every expert is the all-resident arena: no handshake.
  if (!uses_gpu_tier(tier_options_, hp.n_expert)) return nullptr;
  EagerScope eager(*this);
  // Sized for windows of up to 256 rows or the session's largest, whichever is more, so later
  // sequences with other window sizes fit.
  weights_->tier =
      std::make_unique<GpuExpertTier>(tier_options_, hp.n_expert, hp.n_expert_used,
                                      std::max<int64_t>(max_rows, kGpuTierMinWindowRows));
  weights_->tier->prime(source);  // the startup fill, copied in before this first window's handshakes
  return weights_->tier.get();
}

void CudaBackend::moe(const MoeDims& hp, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x, Tensor y,
                      int64_t n_rows, const MoeWeights* next_router) {
  sign(Op::Moe, x, y, layer, n_rows);
  // Every window, replayed or not, has this layer's handshake on the GPU: the tier's host thread
  // must expect it before the window's work is launched.
  GpuExpertTier* tier = weights_->tier_decided ? weights_->tier.get() : nullptr;
  if (!weights_->tier_decided && !replaying()) tier = expert_tier(hp, x.max_rows, experts);
  if (tier) tier->expect(experts);
  if (replaying()) return;
  std::optional<PendingHcCombine> fold = take_hc_combine(x, n_rows);  // before rows(), which would flush it
  const float* xd = rows(x, n_rows, "moe");
  float* yd = rows(y, n_rows, "moe", x.width);
  const int k = hp.n_expert_used, n_expert = hp.n_expert;
  const int64_t H = hp.n_embd, pairs = n_rows * k;
  const LayerExperts* all = tier ? nullptr : &layer_experts(hp, experts, layer);
  scratch_.reset();
  if (pair_capacity_ < pairs || pair_k_ != k) {
    EagerScope eager(*this);
    // Launch tables for up to `pairs` (row, expert) entries: entry i reads row i / k (gate, up)
    // or row i (down, whose inputs are the pairs themselves), one row per entry.
    const int64_t capacity = std::max<int64_t>(pairs, 64 * k);
    std::vector<int32_t> row_of_pair(static_cast<size_t>(capacity)), identity(static_cast<size_t>(capacity)),
        ones(static_cast<size_t>(capacity), 1);
    for (int64_t i = 0; i < capacity; ++i) {
      row_of_pair[size_t(i)] = int32_t(i / k);
      identity[size_t(i)] = int32_t(i);
    }
    row_of_pair_ = DeviceBuffer(size_t(capacity) * 4);
    identity_ = DeviceBuffer(size_t(capacity) * 4);
    ones_ = DeviceBuffer(size_t(capacity) * 4);
    row_of_pair_.upload(row_of_pair.data(), size_t(capacity) * 4);
    identity_.upload(identity.data(), size_t(capacity) * 4);
    ones_.upload(ones.data(), size_t(capacity) * 4);
    pair_capacity_ = capacity;
    pair_k_ = k;
  }
  const ExpertMatrixShape& gate = tier ? tier->layer(layer).gate : all->gate;
  const ExpertMatrixShape& up = tier ? tier->layer(layer).up : all->up;
  const ExpertMatrixShape& down = tier ? tier->layer(layer).down : all->down;
  // x quantized once for everything that reads it: the router's format (the guess router and
  // the shared expert's gate and up usually share it) and the experts' gate/up format, in one
  // launch when they differ. Each matmul gets the bytes it would have quantized itself.
  mark("moe.router.mm");
  const ActivationLayout in_router = activation_layout(w.router.type, H, n_rows);
  const ActivationLayout in_gate = activation_layout(gate.type, H, n_rows);
  const void* act_router = nullptr;
  const void* act_gate = nullptr;
  if (in_gate.format == in_router.format) {
    act_router = act_gate = prepare_x(in_router, xd, scratch_.take(in_router.total_bytes), fold, s());
  } else if (in_router.format != GgmlType::F32 && in_gate.format != GgmlType::F32) {
    void* a = scratch_.take(in_router.total_bytes);
    void* b = scratch_.take(in_gate.total_bytes);
    quantize_activations_two(in_router, a, in_gate, b, xd, s(), fold ? &fold->in : nullptr);
    fold.reset();
    act_router = a;
    act_gate = b;
  } else {
    // One of them is F32, which reads x itself: the quantized one first, so a deferred hc_combine
    // is computed by its quantizer (prepare_x) rather than by a launch of its own.
    void* router_scratch = scratch_.take(in_router.total_bytes);
    void* gate_scratch = scratch_.take(in_gate.total_bytes);
    if (in_router.format == GgmlType::F32) {
      act_gate = prepare_x(in_gate, xd, gate_scratch, fold, s());
      act_router = prepare_x(in_router, xd, router_scratch, fold, s());
    } else {
      act_router = prepare_x(in_router, xd, router_scratch, fold, s());
      act_gate = prepare_x(in_gate, xd, gate_scratch, fold, s());
    }
  }
  // The activations (layout and bytes) above that a matrix of H inputs reads, if any.
  auto shared_act = [&](const WeightMatrix& m) -> std::pair<const ActivationLayout*, const void*> {
    const ActivationLayout l = activation_layout(m.type, m.n_in, n_rows);
    if (l.format == in_router.format && l.n_in == H) return {&in_router, act_router};
    if (l.format == in_gate.format && l.n_in == H) return {&in_gate, act_gate};
    return {nullptr, nullptr};
  };

  // The shared expert does not depend on the routing: a side branch (side_branch) runs it beside
  // router → top-k → handshake → experts, joined before the combine. Its scratch and weights are
  // taken before the fork (see side_branch).
  float* shared = nullptr;
  float* gate_logit = nullptr;
  // An F32 router reads x's floats, as the shared expert's F32 gate logit does: the logit then
  // rides in the router's launch on the main stream (one launch fewer in the side branch).
  const bool gate_logit_with_router = w.has_shared() && w.router.type == GgmlType::F32 &&
                                      in_router.format == GgmlType::F32 && w.router.n_in == H;
  const DeviceMatrix gate_inp_matrix =
      gate_logit_with_router ? matrix(WeightMatrix::dense(GgmlType::F32, H, 1, w.shared_gate_inp.data())) : DeviceMatrix{};
  if (w.has_shared()) {
    const int64_t n_sh = w.shared_gate.n_out;
    const WeightMatrix gate_inp = WeightMatrix::dense(GgmlType::F32, H, 1, w.shared_gate_inp.data());
    const DenseOutput gate_up[] = {{matrix(w.shared_gate), scratch_.floats(n_rows * n_sh)},
                                   {matrix(w.shared_up), scratch_.floats(n_rows * n_sh)}};
    const DeviceMatrix down_m = matrix(w.shared_down), gate_inp_m = matrix(gate_inp);
    shared = scratch_.floats(n_rows * H);
    gate_logit = scratch_.floats(n_rows);
    auto [gate_layout, gate_act] = shared_act(w.shared_gate);
    auto [up_layout, up_act] = shared_act(w.shared_up);
    const ActivationLayout own_gate = activation_layout(w.shared_gate.type, H, n_rows);
    const ActivationLayout own_up = activation_layout(w.shared_up.type, H, n_rows);
    // Neither reads the router's or the experts' format, but both the same one: quantized once.
    const bool up_reads_gates = !gate_layout && !up_layout && own_up.format == own_gate.format;
    void* own_gate_scratch = gate_layout ? nullptr : scratch_.take(own_gate.total_bytes);
    void* own_up_scratch = up_layout || up_reads_gates ? nullptr : scratch_.take(own_up.total_bytes);
    const ActivationLayout in_down = activation_layout(w.shared_down.type, n_sh, n_rows);
    const bool down_in_block = can_quantize_in_block(w.shared_down.type, n_sh, n_rows);
    void* down_scratch = down_in_block ? nullptr : scratch_.take(in_down.total_bytes);
    const ActivationLayout in_gate_inp = activation_layout(GgmlType::F32, H, n_rows);
    void* gate_inp_scratch = gate_logit_with_router ? nullptr : scratch_.take(in_gate_inp.total_bytes);

    side_branch([&](cudaStream_t side) {
      if (!gate_layout) {
        gate_layout = &own_gate;
        gate_act = prepare_activations(own_gate, xd, own_gate_scratch, side);
      }
      if (up_reads_gates) {
        up_layout = gate_layout;
        up_act = gate_act;
      } else if (!up_layout) {
        up_layout = &own_up;
        up_act = prepare_activations(own_up, xd, own_up_scratch, side);
      }
      if (gate_act == up_act && w.shared_gate.type == w.shared_up.type) {
        matmul_quantized_many(gate_up, *gate_layout, gate_act, n_rows, side);
      } else {
        matmul_quantized(gate_up[0].w, *gate_layout, gate_act, n_rows, gate_up[0].y, side);
        matmul_quantized(gate_up[1].w, *up_layout, up_act, n_rows, gate_up[1].y, side);
      }
      if (down_in_block) {
        matmul_in_block(down_m, InBlockActivations{ActivationPrologue::SiluMul, gate_up[0].y, gate_up[1].y}, n_rows,
                        shared, side);
      } else {
        quantize_activations_fused(in_down, ActivationPrologue::SiluMul, gate_up[0].y, gate_up[1].y, 0.0f,
                                   down_scratch, side);
        matmul_quantized(down_m, in_down, down_scratch, n_rows, shared, side);
      }
      if (!gate_logit_with_router)
        matmul_quantized(gate_inp_m, in_gate_inp, prepare_activations(in_gate_inp, xd, gate_inp_scratch, side),
                         n_rows, gate_logit, side);
    });
  }

  // y = W·x from the activations above when W reads one of their formats, else quantized anew.
  auto mm_x = [&](const WeightMatrix& m, float* out) {
    if (auto [l, act] = shared_act(m); l) matmul_quantized(matrix(m), *l, act, n_rows, out, s());
    else mm(m, xd, n_rows, out);
  };
  // With read-ahead, the next layer's router runs on the same input (in the same launch when it
  // has this router's type) and its top-k in the same launch (rows n_rows .. 2 n_rows - 1): the
  // guess published with this layer's ids.
  const bool guess = tier && tier->read_ahead_enabled() && next_router && tier->has_layer(layer + 1);
  const int64_t routed_rows = guess ? 2 * n_rows : n_rows;
  float* logits = scratch_.floats(routed_rows * n_expert);
  if (guess && next_router->router.type == w.router.type && next_router->router.n_in == H) {
    const DenseOutput all[] = {{matrix(w.router), logits},
                               {matrix(next_router->router), logits + n_rows * n_expert},
                               {gate_inp_matrix, gate_logit}};
    matmul_quantized_many(std::span<const DenseOutput>(all, gate_logit_with_router ? 3 : 2), in_router, act_router,
                          n_rows, s());
  } else if (gate_logit_with_router) {
    const DenseOutput both[] = {{matrix(w.router), logits}, {gate_inp_matrix, gate_logit}};
    matmul_quantized_many(both, in_router, act_router, n_rows, s());
    if (guess) mm_x(next_router->router, logits + n_rows * n_expert);
  } else {
    mm_x(w.router, logits);
    if (guess) mm_x(next_router->router, logits + n_rows * n_expert);
  }
  int32_t* ids = scratch_.ints(routed_rows * k);
  float* weights = scratch_.floats(routed_rows * k);
  mark("moe.router.top_k");
  if (const RouteMoce moce = tier ? tier->moce(layer) : RouteMoce{}; moce.lambda > 0)
    route_top_k_moce(logits, routed_rows, n_rows, n_expert, k, moce, ids, weights, s());  // cache-aware
  else
    route_top_k(logits, routed_rows, n_expert, k, ids, weights, s());

  if (tier) {
    // The handshake: publish the ids (and the guess); the host tier brings the misses while the
    // shared expert's branch runs; wait for them. The previous layer's read-ahead branch joins
    // before the publish, or (STRATA_TIER_JOIN=wait) before the wait: either way its copies into
    // this layer's slots have landed and its pending row is written before the wait applies the
    // row (expert_tier.h: the mailbox and the staging parts are safe either way).
    mark("moe.tier.publish");
    if (tier->join_before_publish()) tier->join(s());
    tier->publish(layer, ids, weights, pairs, guess ? ids + pairs : nullptr, guess ? weights + pairs : nullptr,
                  guess ? pairs : 0, s());
  }
  if (tier) {
    mark("moe.tier.wait");
    tier->join(s());  // a no-op when joined before publish
    tier->wait(layer, ids, pairs, s());
    if (guess) tier->read_ahead(s());  // the next layer's guessed experts, beside this layer's work
  }
  const ExpertArenaView view = tier ? tier->view(layer) : all->view;

  mark("moe.experts.gate_up");
  const int64_t n_ff = gate.n_out;
  ActivationLayout in_up = in_gate;
  const void* act_up = act_gate;
  if (up.type != gate.type) {
    in_up = activation_layout(up.type, H, n_rows);
    act_up = prepare_activations(in_up, xd, scratch_.take(in_up.total_bytes), s());
  }
  float* g = scratch_.floats(pairs * n_ff);
  float* u = scratch_.floats(pairs * n_ff);
  const int32_t* by_pair = row_of_pair_.as<int32_t>();
  const int32_t* ones = ones_.as<int32_t>();
  if (act_up == act_gate && can_pair_experts(gate, up)) {
    expert_matmul_quantized_pair(view, 0, gate, up, ids, int(pairs), by_pair, ones, 1, in_gate, act_gate, g, u, s());
  } else {
    expert_matmul_quantized(view, 0, gate, ids, int(pairs), by_pair, ones, 1, in_gate, act_gate, g, s());
    expert_matmul_quantized(view, 0, up, ids, int(pairs), by_pair, ones, 1, in_up, act_up, u, s());
  }
  mark("moe.experts.down");
  float* out = scratch_.floats(pairs * H);
  if (can_quantize_in_block(down.type, n_ff, 1)) {  // each expert's blocks quantize silu(g)·u of its pair
    expert_matmul_in_block(view, 0, down, ids, int(pairs), identity_.as<int32_t>(), ones, 1,
                           InBlockActivations{ActivationPrologue::SiluMul, g, u}, out, s());
  } else {
    const ActivationLayout in_down = activation_layout(down.type, n_ff, pairs);
    void* act_down = scratch_.take(in_down.total_bytes);
    quantize_activations_fused(in_down, ActivationPrologue::SiluMul, g, u, 0.0f, act_down, s());
    expert_matmul_quantized(view, 0, down, ids, int(pairs), identity_.as<int32_t>(), ones, 1, in_down, act_down, out,
                            s());
  }
  join_side();
  // Deferred: the hyper_connection_out that reads y takes it (one launch fewer per layer, the
  // same bits); anything else launches it first (flush_deferred).
  pending_combine_ = PendingMoeCombine{y.id, n_rows, H, yd, MoeCombineInputs{out, weights, k, shared, gate_logit}};
}

}  // namespace strata::compute::cuda::detail
