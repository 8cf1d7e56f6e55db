#include "compute/cpu/matmul.h"

#include <algorithm>

#include "quant/quant.h"
#include "util/error.h"

namespace strata::compute {

namespace {

// Weight bytes per output tile: small enough that the tile stays in L1/L2 while every activation
// row of a row tile passes over it (Zen 4/5: 32–48 KiB L1d, 1 MiB L2 per core).
constexpr size_t kWeightTileBytes = 32 * 1024;
// Activation bytes per row tile: the rows of one tile stay in L2 while the weight tile's rows pass.
constexpr size_t kActivationTileBytes = 256 * 1024;
constexpr size_t kActivationRowAlignment = 64;

void validate(const WeightMatrix& w, const float* x, int64_t n_rows, const float* y) {
  const TypeTraits& traits = type_traits(w.type);
  if (!traits.has_kernels) fail("matmul: weight type {} has no kernels", traits.name);
  if (w.n_in <= 0 || w.n_in % traits.block_elems != 0) {
    fail("matmul: expected n_in a positive multiple of {} ({} block size), found {}",
         traits.block_elems, traits.name, w.n_in);
  }
  if (w.n_out < 0) fail("matmul: expected n_out >= 0, found {}", w.n_out);
  if (n_rows < 0) fail("matmul: expected n_rows >= 0, found {}", n_rows);
  const size_t min_stride = row_bytes(w.type, w.n_in);
  if (w.row_stride_bytes < min_stride) {
    fail("matmul: expected row_stride_bytes >= {} ({} x {}), found {}", min_stride, traits.name,
         w.n_in, w.row_stride_bytes);
  }
  if (n_rows > 0 && w.n_out > 0 && (w.data == nullptr || x == nullptr || y == nullptr)) {
    fail("matmul: null weight, input or output pointer");
  }
}

}  // namespace

WeightMatrix WeightMatrix::dense(GgmlType type, int64_t n_in, int64_t n_out, const void* data) {
  return WeightMatrix{type, n_in, n_out, data, row_bytes(type, n_in)};
}

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y,
            ScratchBuffer& activation_scratch) {
  validate(w, x, n_rows, y);
  if (n_rows == 0 || w.n_out == 0) return;
  const int64_t n_in = w.n_in;
  const int64_t n_out = w.n_out;
  const GgmlType type = w.type;

  // Activations in the dot product's format, one row per input row, 64-byte aligned rows.
  const std::byte* activations = nullptr;
  size_t activation_stride = 0;
  if (quant::activation_type(type) == GgmlType::F32) {
    activations = reinterpret_cast<const std::byte*>(x);  // already in the right format
    activation_stride = size_t(n_in) * sizeof(float);
  } else {
    const size_t row_size = quant::activation_row_bytes(type, n_in);
    activation_stride = (row_size + kActivationRowAlignment - 1) / kActivationRowAlignment *
                        kActivationRowAlignment;
    std::byte* buffer = activation_scratch.reserve(activation_stride * size_t(n_rows));
    auto quantize_rows = [&](int64_t begin, int64_t end, int /*thread_index*/) {
      for (int64_t t = begin; t < end; ++t) {
        quant::quantize_activation(type, x + t * n_in, buffer + size_t(t) * activation_stride,
                                   n_in);
      }
    };
    // A one-row window (decode) is quantized inline: waking the workers costs more than it saves.
    if (n_rows >= 2 * int64_t(pool.size())) {
      pool.parallel_for(n_rows, quantize_rows);
    } else {
      quantize_rows(0, n_rows, 0);
    }
    activations = buffer;
  }

  const quant::DotKernel dot = quant::dot_kernel(type);
  const int64_t outputs_per_tile =
      std::max<int64_t>(1, int64_t(kWeightTileBytes / w.row_stride_bytes));
  const int64_t rows_per_tile =
      std::clamp<int64_t>(int64_t(kActivationTileBytes / activation_stride), 1, n_rows);
  const int64_t n_tiles = (n_out + outputs_per_tile - 1) / outputs_per_tile;

  pool.parallel_for(n_tiles, [&](int64_t tile_begin, int64_t tile_end, int /*thread_index*/) {
    const int64_t o_begin = tile_begin * outputs_per_tile;
    const int64_t o_end = std::min(n_out, tile_end * outputs_per_tile);
    for (int64_t o_tile = o_begin; o_tile < o_end; o_tile += outputs_per_tile) {
      const int64_t o_tile_end = std::min(o_end, o_tile + outputs_per_tile);
      for (int64_t t_tile = 0; t_tile < n_rows; t_tile += rows_per_tile) {
        const int64_t t_tile_end = std::min(n_rows, t_tile + rows_per_tile);
        // One row (decode) calls the kernel pointer: validate() already did the checks
        // quant::dot repeats (0-10 ns per weight row, up to ~5 % of an IQ2_XS row of 4096).
        // More rows go to dot_tile: outputs bitwise one quant::dot each (window identity), but
        // types with a tile kernel decode each weight block once for several rows and load each
        // activation block once for several weight rows.
        const int64_t n_tile_rows = t_tile_end - t_tile;
        const std::byte* tile_activations = activations + size_t(t_tile) * activation_stride;
        if (n_tile_rows == 1) {
          for (int64_t o = o_tile; o < o_tile_end; ++o) {
            y[t_tile * n_out + o] = quant::canonical_nan(dot(w.row(o), tile_activations, n_in));
          }
        } else {
          quant::dot_tile(type, w.row(o_tile), w.row_stride_bytes, o_tile_end - o_tile,
                          tile_activations, activation_stride, n_tile_rows, n_in,
                          y + t_tile * n_out + o_tile, 1, size_t(n_out));
        }
      }
    }
  });
}

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y) {
  matmul(pool, w, x, n_rows, y, pool.scratch(pool.current_thread_index()));
}

void matvec(ThreadPool& pool, const WeightMatrix& w, const float* x, float* y) {
  matmul(pool, w, x, 1, y);
}

}  // namespace strata::compute
