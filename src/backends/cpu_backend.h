// CpuBackend — the reference Backend (compute/backend.h): host buffers, ops that call today's CPU
// functions (compute/cpu/matmul.h, compute/cpu/ops.h and the layer blocks of src/layers/) with
// the window's thread pool and a Workspace for their scratch. It lives in backends/, above
// layers/ (whose blocks it wraps), not in compute/cpu/ with the kernels those blocks run on.
//
// Contract
// - Every op gives exactly the bits of the function it wraps (it passes the same pointers and
//   sizes), so the forward through this backend is the forward the CPU engine always computed.
// - Buffers are host vectors owned here; alloc zero-fills; release frees. Nothing is allocated by
//   ops once a window shape has run (the scratch Workspace keeps its vectors).
// - One window thread at a time; begin_window binds the pool used until the next begin_window.
#pragma once

#include <memory>
#include <vector>

#include "compute/backend.h"
#include "compute/cpu/thread_pool.h"
#include "compute/cpu/workspace.h"

namespace strata::compute {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  Tensor alloc(DType type, int64_t max_rows, int64_t width) override;
  void release(Tensor t) override;
  void read(Tensor t, int64_t first_row, int64_t n_rows, float* out) override;
  void write(Tensor t, int64_t first_row, int64_t n_rows, const float* in) override;
  void copy_rows(Tensor src, int64_t src_row, Tensor dst, int64_t dst_row, int64_t n_rows) override;
  void pair_rows(Tensor a, Tensor b, int n_streams, Tensor out, int64_t n_rows) override;
  void begin_window(ThreadPool& host_pool) override { pool_ = &host_pool; }

  void embed(const WeightMatrix& table, std::span<const int32_t> tokens, Tensor out) override;
  void repeat(Tensor x, int n_copies, Tensor out, int64_t n_rows) override;
  void rms_norm(Tensor x, std::span<const float> weight, float eps, Tensor out,
                int64_t n_rows) override;
  void add(Tensor acc, Tensor y, int64_t n_rows) override;
  void matmul(const WeightMatrix& w, Tensor x, int64_t first_row, int64_t n_rows,
              Tensor y) override;
  void argmax(Tensor x, int64_t n_rows, Tensor ids) override;
  void hyper_connection_in(const HyperConnectionWeights& w, int n_streams, float eps, Tensor X,
                           Tensor x, Tensor inject, int64_t n_rows) override;
  void hyper_connection_out(int n_streams, Tensor y, Tensor inject, Tensor X,
                            int64_t n_rows) override;
  void hyper_connection_out_in(int n_streams, Tensor y, Tensor inject, Tensor X,
                               const HyperConnectionWeights& next, float eps, Tensor x,
                               Tensor next_inject, int64_t n_rows) override;
  void gated_deltanet(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                      GatedDeltaNetState& state, int layer, Tensor x, Tensor y, int64_t n_rows,
                      bool record_window) override;
  void attention(const AttentionDims& dims, const AttentionWeights& w, KvCache& cache, int layer,
                 Tensor x, Tensor y, int64_t n_rows) override;
  bool batched_mixers() const override { return true; }
  void gated_deltanet_rows(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                           std::span<GatedDeltaNetState* const> states,
                           std::span<const RowSegment> segments, int layer, Tensor x, Tensor y,
                           int64_t n_rows) override;
  void attention_rows(const AttentionDims& dims, const AttentionWeights& w,
                      std::span<KvCache* const> caches, std::span<const RowSegment> segments,
                      int layer, Tensor x, Tensor y, int64_t n_rows) override;
  void ple(const PleDims& dims, const PleWeights& w, PleState& state, PleRowReader& rows, Tensor X,
           int64_t n_rows, bool record_window) override;
  void ple_rows(const PleDims& dims, const PleWeights& w, std::span<PleState* const> states,
                std::span<PleRowReader* const> readers, std::span<const RowSegment> segments, Tensor X,
                int64_t n_rows) override;
  void moe(const MoeDims& dims, const MoeWeights& w, ExpertSource& experts, int layer, Tensor x,
           Tensor y, int64_t n_rows, const MoeWeights* next_router) override;

 private:
  // Rows [0, n_rows) of t, checked against its shape (and width when given).
  float* rows(Tensor t, int64_t n_rows, const char* op, int64_t width = -1);
  ThreadPool& pool(const char* op);

  ThreadPool* pool_ = nullptr;
  Workspace ws_;
  std::vector<const float*> embedding_blocks_;  // ple_rows: each reader's rows (kept: no allocation once warm)
  // I32 tensors are stored in the same float vectors (4 bytes per element), read as int32.
  std::vector<std::vector<float>> buffers_;
  std::vector<uint32_t> free_ids_;
};

}  // namespace strata::compute
