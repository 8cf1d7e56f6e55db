#include "backends/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "compute/cpu/matmul.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "layers/attention.h"
#include "layers/gated_deltanet.h"
#include "layers/hyper_connection.h"
#include "layers/moe.h"
#include "layers/ple.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata::compute {

static_assert(sizeof(float) == sizeof(int32_t));

Tensor CpuBackend::alloc(DType type, int64_t max_rows, int64_t width) {
  if (max_rows < 1 || width < 1)
    fail("cpu backend: alloc: expected max_rows >= 1 and width >= 1, found {} x {}", max_rows,
         width);
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = uint32_t(buffers_.size());
    buffers_.emplace_back();
  }
  // Storage first, advised for huge pages before the zeroing touches it (see Workspace::grow).
  std::vector<float>& buffer = buffers_[id];
  buffer.reserve(size_t(max_rows * width));
  compute::advise_huge_pages(buffer.data(), buffer.capacity() * sizeof(float));
  buffer.assign(size_t(max_rows * width), 0.0f);
  return Tensor{id, type, max_rows, width};
}

void CpuBackend::release(Tensor t) {
  if (!t.valid() || t.id >= buffers_.size()) return;
  std::vector<float>().swap(buffers_[t.id]);
  free_ids_.push_back(t.id);
}

float* CpuBackend::rows(Tensor t, int64_t n_rows, const char* op, int64_t width) {
  if (!t.valid() || t.id >= buffers_.size())
    fail("cpu backend: {}: invalid tensor handle", op);
  if (n_rows < 0 || n_rows > t.max_rows)
    fail("cpu backend: {}: {} rows asked of a tensor of {} rows", op, n_rows, t.max_rows);
  if (width >= 0 && width != t.width)
    fail("cpu backend: {}: expected a tensor of width {}, found {}", op, width, t.width);
  return buffers_[t.id].data();
}

ThreadPool& CpuBackend::pool(const char* op) {
  if (!pool_) fail("cpu backend: {}: no thread pool bound (begin_window first)", op);
  return *pool_;
}

void CpuBackend::read(Tensor t, int64_t first_row, int64_t n_rows, float* out) {
  const float* data = rows(t, first_row + n_rows, "read");
  std::copy_n(data + first_row * t.width, n_rows * t.width, out);
}

void CpuBackend::write(Tensor t, int64_t first_row, int64_t n_rows, const float* in) {
  float* data = rows(t, first_row + n_rows, "write");
  std::copy_n(in, n_rows * t.width, data + first_row * t.width);
}

void CpuBackend::copy_rows(Tensor src, int64_t src_row, Tensor dst, int64_t dst_row,
                           int64_t n_rows) {
  if (src.id == dst.id) fail("cpu backend: copy_rows: source and destination are one tensor");
  const float* from = rows(src, src_row + n_rows, "copy_rows");
  float* to = rows(dst, dst_row + n_rows, "copy_rows", src.width);
  std::copy_n(from + src_row * src.width, n_rows * src.width, to + dst_row * dst.width);
}

void CpuBackend::pair_rows(Tensor a, Tensor b, int n_streams, Tensor out, int64_t n_rows) {
  const int64_t w = b.width / n_streams;
  if (w * n_streams != b.width)
    fail("cpu backend: pair_rows: width {} is not {} streams", b.width, n_streams);
  const float* ad = rows(a, n_rows, "pair_rows");
  const float* bd = rows(b, n_rows, "pair_rows");
  float* od = rows(out, n_rows * n_streams, "pair_rows", a.width + w);
  pair_rows_host(ad, a.width, bd, w, n_streams, n_rows, od);
}

void CpuBackend::embed(const WeightMatrix& table, std::span<const int32_t> tokens, Tensor out) {
  const int64_t n_rows = int64_t(tokens.size());
  float* y = rows(out, n_rows, "embed", table.n_in);
  ScopedPart part(Part::Embed);
  for (int64_t t = 0; t < n_rows; ++t)
    quant::dequantize_row(table.type, table.row(tokens[size_t(t)]), y + t * table.n_in,
                          table.n_in);
}

void CpuBackend::repeat(Tensor x, int n_copies, Tensor out, int64_t n_rows) {
  const float* src = rows(x, n_rows, "repeat");
  float* dst = rows(out, n_rows, "repeat", x.width * n_copies);
  ScopedPart part(Part::Embed);
  for (int64_t t = 0; t < n_rows; ++t)
    for (int s = 0; s < n_copies; ++s)
      std::copy_n(src + t * x.width, x.width, dst + t * out.width + s * x.width);
}

void CpuBackend::rms_norm(Tensor x, std::span<const float> weight, float eps, Tensor out,
                          int64_t n_rows) {
  const int64_t width = int64_t(weight.size());
  const float* src = rows(x, n_rows, "rms_norm", width);
  float* dst = rows(out, n_rows, "rms_norm", width);
  for (int64_t t = 0; t < n_rows; ++t)
    compute::rms_norm(src + t * width, weight.data(), width, eps, dst + t * width);
}

void CpuBackend::add(Tensor acc, Tensor y, int64_t n_rows) {
  float* a = rows(acc, n_rows, "add");
  const float* b = rows(y, n_rows, "add", acc.width);
  const int64_t n = n_rows * acc.width;
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void CpuBackend::matmul(const WeightMatrix& w, Tensor x, int64_t first_row, int64_t n_rows,
                        Tensor y) {
  const float* src = rows(x, first_row + n_rows, "matmul", w.n_in);
  float* dst = rows(y, n_rows, "matmul", w.n_out);
  compute::matmul(pool("matmul"), w, src + first_row * w.n_in, n_rows, dst);
}

void CpuBackend::argmax(Tensor x, int64_t n_rows, Tensor ids) {
  const float* src = rows(x, n_rows, "argmax");
  float* dst = rows(ids, n_rows, "argmax", 1);
  for (int64_t t = 0; t < n_rows; ++t) {
    const int32_t id = int32_t(compute::argmax(src + t * x.width, x.width));
    std::memcpy(dst + t, &id, sizeof id);
  }
}

void CpuBackend::hyper_connection_in(const HyperConnectionWeights& w, int n_streams, float eps,
                                     Tensor X, Tensor x, Tensor inject, int64_t n_rows) {
  const float* Xd = rows(X, n_rows, "hyper_connection_in");
  const int64_t n_embd = X.width / n_streams;
  float* xd = rows(x, n_rows, "hyper_connection_in", n_embd);
  float* inj = inject.valid() ? rows(inject, n_rows, "hyper_connection_in", n_streams) : nullptr;
  ScopedPart part(Part::HcIn);
  strata::hyper_connection_in(pool("hyper_connection_in"), ws_, w, n_streams, n_embd, eps, Xd,
                              n_rows, xd, inj);
}

void CpuBackend::hyper_connection_out(int n_streams, Tensor y, Tensor inject, Tensor X,
                                      int64_t n_rows) {
  float* Xd = rows(X, n_rows, "hyper_connection_out");
  const int64_t n_embd = X.width / n_streams;
  const float* yd = rows(y, n_rows, "hyper_connection_out", n_embd);
  const float* inj = rows(inject, n_rows, "hyper_connection_out", n_streams);
  ScopedPart part(Part::HcOut);
  // By the row slices hyper_connection_in and the MoE take (compute/cpu/row_slices.h): each
  // slice's X rows stay on the core that reads them next. Rows never mix.
  ThreadPool& threads = pool("hyper_connection_out");
  if (compute::takes_row_slices(threads, n_rows)) {
    const int64_t width = X.width;
    compute::for_each_row_slice(threads, n_rows, [&](int64_t begin, int64_t end, int) {
      strata::hyper_connection_out(n_streams, n_embd, yd + begin * n_embd, inj + begin * n_streams,
                                   end - begin, Xd + begin * width);
    });
    return;
  }
  strata::hyper_connection_out(n_streams, n_embd, yd, inj, n_rows, Xd);
}

void CpuBackend::hyper_connection_out_in(int n_streams, Tensor y, Tensor inject, Tensor X,
                                         const HyperConnectionWeights& next, float eps, Tensor x,
                                         Tensor next_inject, int64_t n_rows) {
  ThreadPool& threads = pool("hyper_connection_out_in");
  float* Xd = rows(X, n_rows, "hyper_connection_out_in");
  const int64_t n_embd = X.width / n_streams;
  const float* yd = rows(y, n_rows, "hyper_connection_out_in", n_embd);
  const float* inj = rows(inject, n_rows, "hyper_connection_out_in", n_streams);
  float* xd = rows(x, n_rows, "hyper_connection_out_in", n_embd);
  float* next_inj = next_inject.valid()
                        ? rows(next_inject, n_rows, "hyper_connection_out_in", n_streams)
                        : nullptr;
  // Timed per part there (layers/hyper_connection.cpp): on the window thread's slice, or "hc in"
  // for the chained form (whose first step is the out).
  strata::hyper_connection_out_in(threads, ws_, n_streams, n_embd, yd, inj, Xd, next, eps, n_rows,
                                  xd, next_inj);
}

void CpuBackend::gated_deltanet(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                                GatedDeltaNetState& state, int /*layer*/, Tensor x, Tensor y,
                                int64_t n_rows, bool record_window) {
  const float* xd = rows(x, n_rows, "gated_deltanet");
  float* yd = rows(y, n_rows, "gated_deltanet", x.width);
  gated_deltanet_forward(pool("gated_deltanet"), ws_, dims, w, state, xd, n_rows, yd,
                         record_window);
}

void CpuBackend::gated_deltanet_rows(const DeltaNetDims& dims, const GatedDeltaNetWeights& w,
                                     std::span<GatedDeltaNetState* const> states,
                                     std::span<const RowSegment> segments, int /*layer*/, Tensor x,
                                     Tensor y, int64_t n_rows) {
  const float* xd = rows(x, n_rows, "gated_deltanet_rows");
  float* yd = rows(y, n_rows, "gated_deltanet_rows", x.width);
  gated_deltanet_forward_rows(pool("gated_deltanet_rows"), ws_, dims, w, states, segments, xd,
                              n_rows, yd);
}

void CpuBackend::attention_rows(const AttentionDims& dims, const AttentionWeights& w,
                                std::span<KvCache* const> caches,
                                std::span<const RowSegment> segments, int /*layer*/, Tensor x,
                                Tensor y, int64_t n_rows) {
  const float* xd = rows(x, n_rows, "attention_rows");
  float* yd = rows(y, n_rows, "attention_rows", x.width);
  attention_forward_rows(pool("attention_rows"), ws_, dims, w, caches, segments, xd, n_rows, yd);
}

void CpuBackend::attention(const AttentionDims& dims, const AttentionWeights& w, KvCache& cache,
                           int /*layer*/, Tensor x, Tensor y, int64_t n_rows) {
  const float* xd = rows(x, n_rows, "attention");
  float* yd = rows(y, n_rows, "attention", x.width);
  attention_forward(pool("attention"), ws_, dims, w, cache, xd, n_rows, yd);
}

void CpuBackend::ple(const PleDims& dims, const PleWeights& w, PleState& state,
                     PleRowReader& reader, Tensor X, int64_t n_rows, bool record_window) {
  float* Xd = rows(X, n_rows, "ple");
  ScopedPart part(Part::Ple);
  const std::vector<float>& embeddings = reader.collect();
  ple_forward(pool("ple"), ws_, dims, w, state, embeddings.data(), n_rows, Xd, record_window);
}

void CpuBackend::ple_rows(const PleDims& dims, const PleWeights& w, std::span<PleState* const> states,
                          std::span<PleRowReader* const> readers, std::span<const RowSegment> segments,
                          Tensor X, int64_t n_rows) {
  float* Xd = rows(X, n_rows, "ple_rows");
  ScopedPart part(Part::Ple);
  if (readers.size() != segments.size())
    fail("ple_rows: {} row readers for {} row segments", readers.size(), segments.size());
  embedding_blocks_.clear();
  for (PleRowReader* reader : readers) embedding_blocks_.push_back(reader->collect().data());
  ple_forward_rows(pool("ple_rows"), ws_, dims, w, states, embedding_blocks_, segments, n_rows, Xd);
}

void CpuBackend::moe(const MoeDims& dims, const MoeWeights& w, ExpertSource& experts, int layer,
                     Tensor x, Tensor y, int64_t n_rows, const MoeWeights* next_router) {
  const float* xd = rows(x, n_rows, "moe");
  float* yd = rows(y, n_rows, "moe", x.width);
  moe_forward(pool("moe"), ws_, dims, w, experts, layer, xd, n_rows, yd, next_router);
}

}  // namespace strata::compute
