#include "compute/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "compute/cpu/work_estimate.h"
#include "quant/quant.h"
#include "util/byte_size.h"
#include "util/error.h"

namespace strata::compute {

namespace {

// Weight bytes per output tile: small enough that the tile stays in L1/L2 while every activation
// row of a row tile passes over it (Zen 4/5: 32–48 KiB L1d, 1 MiB L2 per core).
constexpr size_t kWeightTileBytes = 32 * 1024;
// Activation bytes per row tile: the rows of one tile stay in L2 while the weight tile's rows pass.
constexpr size_t kActivationTileBytes = 256 * 1024;
constexpr size_t kActivationRowAlignment = 64;
// Multiply-adds a tile must hold before a product is cut into more tiles than its weight bytes
// ask for: a window of several rows over a small matrix (the default model's 256 x 256
// projections are 3 tiles of 32 KiB) otherwise leaves one thread doing the whole product. A
// 16-row window over 256 inputs then gets tiles of 8 outputs (~2 µs each with AVX-512).
constexpr int64_t kMinTileMacs = 32 * 1024;
// Tiles per thread a product is cut into when it has the work for them (the pool's chunking
// wants about 4 chunks per thread).
constexpr int64_t kTilesPerThread = 4;

// Software prefetch of a decode row's weights (one activation row: every weight byte is read
// once and then never again). On the 16-core Xeon host of the GPU box (session 50, bench_matvec)
// one thread's Q4_K matvec streamed 6.9 GB/s where the DRAM read reaches 10.7 and the same kernel
// on an in-cache matrix 14.2, and IQ2_XS 4.1 against 10.7 and 4.7: time ≈ load time + decode
// time, as if nothing ran ahead of a compute-heavy loop. So before each row's dot (or each
// one-row tile's), every line up to weight_prefetch_bytes() past what is about to be computed is
// requested, each line once, and its loads are in flight while this row decodes. A prefetch is a
// hint: no output bit depends on it.
constexpr size_t kCacheLine = 64;
constexpr size_t kMaxPrefetchBytes = size_t(1) << 20;
constexpr const char* kPrefetchVariable = "STRATA_CPU_PREFETCH_BYTES";

// STRATA_CPU_PREFETCH_BYTES when set: a byte size (parse_byte_size: "2048", "2K") up to 1 MiB.
size_t prefetch_bytes_from_environment() {
  const char* value = std::getenv(kPrefetchVariable);
  if (value == nullptr || *value == '\0') return kDefaultWeightPrefetchBytes;
  const std::string_view text(value);
  if (text.ends_with('%')) fail("{}: expected a byte count (2048, 2K), found '{}'", kPrefetchVariable, value);
  const uint64_t bytes = parse_byte_size(text, 0, kPrefetchVariable);
  if (bytes > kMaxPrefetchBytes) fail("{}: expected at most 1M, found '{}'", kPrefetchVariable, value);
  return size_t(bytes);
}

// SIZE_MAX: not yet read from the environment.
std::atomic<size_t> g_weight_prefetch_bytes{SIZE_MAX};

// Rows [o_begin, o_end) of a matrix requested line by line, weight_prefetch_bytes() ahead of the
// position the caller names (default-constructed: inactive, requests nothing).
class WeightRangePrefetch {
 public:
  WeightRangePrefetch() = default;
  WeightRangePrefetch(const WeightMatrix& w, int64_t o_begin, int64_t o_end)
      : distance_(compute::weight_prefetch_bytes()),
        next_(reinterpret_cast<uintptr_t>(w.row(o_begin)) & ~uintptr_t(kCacheLine - 1)),
        end_(reinterpret_cast<uintptr_t>(w.row(o_end - 1)) + w.row_stride_bytes) {}
  // Requests every line before min(position + distance, the range's end) not yet requested.
  void request_until(const std::byte* position) {
    if (distance_ == 0) return;
    const uintptr_t want = std::min(reinterpret_cast<uintptr_t>(position) + distance_, end_);
    for (; next_ < want; next_ += kCacheLine) __builtin_prefetch(reinterpret_cast<const void*>(next_), 0, 3);
  }

 private:
  size_t distance_ = 0;
  uintptr_t next_ = 0, end_ = 0;
};

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

size_t weight_prefetch_bytes() {
  size_t bytes = g_weight_prefetch_bytes.load(std::memory_order_relaxed);
  if (bytes == SIZE_MAX) {
    bytes = prefetch_bytes_from_environment();
    g_weight_prefetch_bytes.store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

void set_weight_prefetch_bytes(size_t bytes) {
  if (bytes > kMaxPrefetchBytes)
    fail("set_weight_prefetch_bytes: expected at most {} bytes, found {}", kMaxPrefetchBytes, bytes);
  g_weight_prefetch_bytes.store(bytes, std::memory_order_relaxed);
}

WeightMatrix WeightMatrix::dense(GgmlType type, int64_t n_in, int64_t n_out, const void* data) {
  return WeightMatrix{type, n_in, n_out, data, row_bytes(type, n_in)};
}

namespace {

size_t aligned_activation_stride(GgmlType type, int64_t n_in) {
  const size_t row_size = quant::activation_row_bytes(type, n_in);
  return (row_size + kActivationRowAlignment - 1) / kActivationRowAlignment *
         kActivationRowAlignment;
}

// Converts rows [0, n_rows) of x into dst, one row per stride.
void quantize_rows_into(ThreadPool& pool, GgmlType type, const float* x, int64_t n_rows,
                        int64_t n_in, std::byte* dst, size_t stride) {
  auto quantize_rows = [&](int64_t begin, int64_t end, int /*thread_index*/) {
    for (int64_t t = begin; t < end; ++t)
      quant::quantize_activation(type, x + t * n_in, dst + size_t(t) * stride, n_in);
  };
  // A one-row window (decode) is quantized inline: waking the workers costs more than it saves.
  if (n_rows >= 2 * int64_t(pool.size())) {
    pool.parallel_for(n_rows, quantize_rows);
  } else {
    quantize_rows(0, n_rows, 0);
  }
}

// One product of a matmul call: the weights, the converted activations and the tiling.
struct ProductJob {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  const std::byte* activations = nullptr;
  size_t activation_stride = 0;
  int64_t n_rows = 0;
  int64_t outputs_per_tile = 1;
  int64_t rows_per_tile = 1;
  int64_t n_tiles = 0;
};

// Which tile an output lands in never changes its bits (each is one dot of one weight row and
// one activation row), so the tiling is free to follow the thread count.
ProductJob make_job(const WeightMatrix& w, float* y, const std::byte* activations,
                    size_t activation_stride, int64_t n_rows, int n_threads) {
  ProductJob job{&w, y, activations, activation_stride, n_rows};
  job.outputs_per_tile = std::max<int64_t>(1, int64_t(kWeightTileBytes / w.row_stride_bytes));
  if (n_threads > 1) {
    // Even counts: the tile kernels work on pairs of weight rows.
    auto even = [](int64_t n) { return std::max<int64_t>(2, (n + 1) / 2 * 2); };
    const int64_t min_outputs = even((kMinTileMacs + n_rows * w.n_in - 1) / (n_rows * w.n_in));
    const int64_t split_outputs = even((w.n_out + n_threads * kTilesPerThread - 1) /
                                       (int64_t(n_threads) * kTilesPerThread));
    job.outputs_per_tile = std::min(job.outputs_per_tile, std::max(min_outputs, split_outputs));
  }
  job.rows_per_tile =
      std::clamp<int64_t>(int64_t(kActivationTileBytes / activation_stride), 1, n_rows);
  job.n_tiles = (w.n_out + job.outputs_per_tile - 1) / job.outputs_per_tile;
  return job;
}

// Outputs [o_begin, o_end) of one product, in tiles of job.outputs_per_tile from o_begin.
void run_outputs(const ProductJob& job, int64_t o_begin, int64_t o_end) {
  const WeightMatrix& w = *job.w;
  const int64_t n_in = w.n_in, n_out = w.n_out, n_rows = job.n_rows;
  const quant::DotKernel dot = quant::dot_kernel(w.type);
  // One activation row goes through dot_tile too where that measured faster than `dot`: rows of
  // one block (the default model's rank-32 up projections and expert downs), whose kernels
  // (AVX-512 Q8_0) run 16 such rows in one pass where `dot` pays a call, a tail block and a
  // horizontal sum per output; and Q8_0 rows on AVX-512, whose tiles prepare the activation row
  // once for every pair of weight rows and take two blocks per step (bench_matmul_tile
  // BM_ExpertWindow/q8_0/rows:1 on the Zen 4 build VM: 23-28 -> 17-18 µs).
  const bool one_row_tiles =
      n_in == type_traits(w.type).block_elems ||
      (w.type == GgmlType::Q8_0 && quant::active_kernel_level() == quant::KernelLevel::Avx512);
  float* y = job.y;
  // A decode row's weights stream from DRAM: before each row (or one-row tile) is computed, the
  // lines up to weight_prefetch_bytes() past its end are requested.
  WeightRangePrefetch prefetch;
  if (n_rows == 1 && o_begin < o_end) prefetch = WeightRangePrefetch(w, o_begin, o_end);
  for (int64_t o_tile = o_begin; o_tile < o_end; o_tile += job.outputs_per_tile) {
    const int64_t o_tile_end = std::min(o_end, o_tile + job.outputs_per_tile);
    for (int64_t t_tile = 0; t_tile < n_rows; t_tile += job.rows_per_tile) {
      const int64_t t_tile_end = std::min(n_rows, t_tile + job.rows_per_tile);
      // One row (decode) calls the kernel pointer: validate() already did the checks
      // quant::dot repeats (0-10 ns per weight row, up to ~5 % of an IQ2_XS row of 4096).
      // More rows go to dot_tile: outputs bitwise one quant::dot each (window identity), but
      // types with a tile kernel decode each weight block once for several rows and load each
      // activation block once for several weight rows.
      const int64_t n_tile_rows = t_tile_end - t_tile;
      const std::byte* tile_activations = job.activations + size_t(t_tile) * job.activation_stride;
      if (n_tile_rows == 1 && !one_row_tiles) {
        for (int64_t o = o_tile; o < o_tile_end; ++o) {
          prefetch.request_until(w.row(o) + w.row_stride_bytes);
          y[t_tile * n_out + o] = quant::canonical_nan(dot(w.row(o), tile_activations, n_in));
        }
      } else {
        prefetch.request_until(w.row(o_tile_end - 1) + w.row_stride_bytes);
        quant::dot_tile(w.type, w.row(o_tile), w.row_stride_bytes, o_tile_end - o_tile,
                        tile_activations, job.activation_stride, n_tile_rows, n_in,
                        y + t_tile * n_out + o_tile, 1, size_t(n_out));
      }
    }
  }
}

// Output tiles [tile_begin, tile_end) of one product.
void run_tiles(const ProductJob& job, int64_t tile_begin, int64_t tile_end) {
  run_outputs(job, tile_begin * job.outputs_per_tile,
              std::min(job.w->n_out, tile_end * job.outputs_per_tile));
}

// Every tile of every job in one parallel_for (tiles numbered job after job). Which thread runs
// a tile never changes its bits, so neither does the pool's inline rule: the products' estimated
// time (one dot per output and row) goes with the hand-out, and one too small to pay for it runs
// on the caller (a 256 x 256 Q8_0 matvec is ~3 µs, about what a hand-out costs on the 2-vCPU
// build VM).
// With `convert` (a step that writes the jobs' activations, one task), the conversion goes out
// in the same hand-out as the tiles, first (ThreadPool::run_phases): the workers join while the
// caller converts instead of after, and the tiles start as soon as it is done. A decode row's
// conversion (0.5-2 µs for 1024-4096 inputs) otherwise ran on the caller before every hand-out
// (~10 a layer), next to a hand-out that costs 6-8 µs at 16 threads.
void run_jobs(ThreadPool& pool, std::span<const ProductJob> jobs,
              const ThreadPool::TaskFn* convert = nullptr) {
  int64_t total = 0;
  double work_ns = 0;
  const bool estimate = pool.size() > 1 && pool.inline_work_ns() > 0;
  for (const ProductJob& job : jobs) {
    total += job.n_tiles;
    if (estimate) work_ns += dot_work_ns(job.w->type, job.n_rows * job.w->n_out, job.w->n_in);
  }
  const auto tiles = [&](int64_t begin, int64_t end, int /*thread_index*/) {
    int64_t first = 0;
    for (const ProductJob& job : jobs) {
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + job.n_tiles);
      if (lo < hi) run_tiles(job, lo - first, hi - first);
      first += job.n_tiles;
      if (first >= end) break;
    }
  };
  if (convert != nullptr && total > 1 && pool.phase_chains()) {
    const ThreadPool::Phase phases[] = {{1, *convert}, {total, tiles}};
    pool.run_phases(phases, work_ns);
    return;
  }
  if (convert != nullptr) (*convert)(0, 1, pool.current_thread_index());
  pool.parallel_for(total, work_ns, tiles);
}

}  // namespace

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y,
            ScratchBuffer& activation_scratch) {
  const MatmulProduct product{&w, y};
  matmul_many(pool, std::span<const MatmulProduct>(&product, 1), x, n_rows, activation_scratch);
}

void matmul_many(ThreadPool& pool, std::span<const MatmulProduct> products, const float* x,
                 int64_t n_rows, ScratchBuffer& activation_scratch) {
  if (products.size() > kMaxProducts)
    fail("matmul_many: expected at most {} products, found {}", kMaxProducts, products.size());
  for (const MatmulProduct& p : products) {
    if (p.w == nullptr) fail("matmul_many: null weight matrix");
    validate(*p.w, x, n_rows, p.y);
    if (p.w->n_in != products[0].w->n_in)
      fail("matmul_many: expected every matrix to take {} inputs, found {}", products[0].w->n_in,
           p.w->n_in);
  }
  if (n_rows == 0 || products.empty()) return;
  const int64_t n_in = products[0].w->n_in;
  // Each distinct activation format once: [offset into the scratch, stride] per product.
  std::array<GgmlType, kMaxProducts> formats{};
  std::array<size_t, kMaxProducts> format_offset{}, format_stride{};
  std::array<size_t, kMaxProducts> product_format{};
  size_t n_formats = 0, bytes = 0;
  for (size_t i = 0; i < products.size(); ++i) {
    const GgmlType type = quant::activation_type(products[i].w->type);
    size_t f = 0;
    while (f < n_formats && formats[f] != type) ++f;
    if (f == n_formats) {
      formats[f] = type;
      format_offset[f] = bytes;
      format_stride[f] = type == GgmlType::F32
                             ? size_t(n_in) * sizeof(float)
                             : aligned_activation_stride(products[i].w->type, n_in);
      if (type != GgmlType::F32) bytes += format_stride[f] * size_t(n_rows);
      ++n_formats;
    }
    product_format[i] = f;
  }
  std::byte* buffer = bytes > 0 ? activation_scratch.reserve(bytes) : nullptr;
  std::array<const std::byte*, kMaxProducts> format_data{};
  for (size_t f = 0; f < n_formats; ++f)
    format_data[f] = formats[f] == GgmlType::F32
                         ? reinterpret_cast<const std::byte*>(x)  // already in the right format
                         : buffer + format_offset[f];
  // Each converted format once; the first product of a format names the weight type
  // quantize_activation dispatches on. `parallel` splits the rows over the pool (long windows).
  const auto convert_formats = [&](bool parallel) {
    for (size_t f = 0; f < n_formats; ++f) {
      if (formats[f] == GgmlType::F32) continue;
      size_t first = 0;
      while (product_format[first] != f) ++first;
      if (parallel) {
        quantize_rows_into(pool, products[first].w->type, x, n_rows, n_in,
                           buffer + format_offset[f], format_stride[f]);
      } else {
        for (int64_t t = 0; t < n_rows; ++t)
          quant::quantize_activation(products[first].w->type, x + t * n_in,
                                     buffer + format_offset[f] + size_t(t) * format_stride[f],
                                     n_in);
      }
    }
  };
  std::array<ProductJob, kMaxProducts> jobs;
  for (size_t i = 0; i < products.size(); ++i) {
    const size_t f = product_format[i];
    jobs[i] = make_job(*products[i].w, products[i].y, format_data[f], format_stride[f], n_rows,
                       pool.size());
  }
  const std::span<const ProductJob> job_span(jobs.data(), products.size());
  // Long windows convert their rows split over the pool, then hand out the tiles; a few rows
  // (quantize_rows_into would convert them on the caller) go in the tiles' hand-out.
  if (bytes == 0 || n_rows >= 2 * int64_t(pool.size())) {
    convert_formats(/*parallel=*/true);
    run_jobs(pool, job_span);
    return;
  }
  const auto convert = [&](int64_t, int64_t, int) { convert_formats(/*parallel=*/false); };
  const ThreadPool::TaskFn convert_fn(convert);
  run_jobs(pool, job_span, &convert_fn);
}

void matmul_many(ThreadPool& pool, std::span<const MatmulProduct> products, const float* x,
                 int64_t n_rows) {
  matmul_many(pool, products, x, n_rows, pool.scratch(pool.current_thread_index()));
}

size_t activation_row_stride(GgmlType weight_type, int64_t n_in) {
  return quant::activation_type(weight_type) == GgmlType::F32
             ? size_t(n_in) * sizeof(float)
             : aligned_activation_stride(weight_type, n_in);
}

ActivationRows quantize_activation_rows(ThreadPool& pool, GgmlType weight_type, const float* x,
                                        int64_t n_rows, int64_t n_in, std::byte* dst) {
  const size_t stride = activation_row_stride(weight_type, n_in);
  quantize_rows_into(pool, weight_type, x, n_rows, n_in, dst, stride);
  return ActivationRows{quant::activation_type(weight_type), n_in, n_rows, dst, stride};
}

namespace {

// The job of y = W·rows, after checking that W can take the rows (`caller` names the function
// in the error).
ProductJob rows_job(const char* caller, int n_threads, const WeightMatrix* w, float* y,
                    const ActivationRows& rows) {
  if (w == nullptr) fail("{}: null weight matrix", caller);
  // validate() checks the pointers against the f32 view; the rows' data stands in for x.
  validate(*w, reinterpret_cast<const float*>(rows.data), rows.n_rows, y);
  if (quant::activation_type(w->type) != rows.activation_type || w->n_in != rows.n_in)
    fail("{}: weights of type {} with {} inputs cannot take activation rows of type {} with {} inputs",
         caller, type_traits(w->type).name, w->n_in, type_traits(rows.activation_type).name, rows.n_in);
  return make_job(*w, y, rows.data, rows.row_stride_bytes, rows.n_rows, n_threads);
}

}  // namespace

void matmul_rows(ThreadPool& pool, std::span<const MatmulProduct> products,
                 const ActivationRows& rows) {
  if (products.size() > kMaxProducts)
    fail("matmul_rows: expected at most {} products, found {}", kMaxProducts, products.size());
  if (rows.n_rows == 0) return;
  std::array<ProductJob, kMaxProducts> jobs;
  for (size_t i = 0; i < products.size(); ++i)
    jobs[i] = rows_job("matmul_rows", pool.size(), products[i].w, products[i].y, rows);
  run_jobs(pool, std::span<const ProductJob>(jobs.data(), products.size()));
}

void matmul_rows_each(ThreadPool& pool, std::span<const RowsProduct> products) {
  if (products.size() > kMaxRowsProducts)
    fail("matmul_rows_each: expected at most {} products, found {}", kMaxRowsProducts,
         products.size());
  std::array<ProductJob, kMaxRowsProducts> jobs;
  size_t n_jobs = 0;
  for (const RowsProduct& p : products)
    if (p.rows.n_rows > 0)
      jobs[n_jobs++] = rows_job("matmul_rows_each", pool.size(), p.w, p.y, p.rows);
  if (n_jobs > 0) run_jobs(pool, std::span<const ProductJob>(jobs.data(), n_jobs));
}

void matmul_rows_range(const WeightMatrix& w, const ActivationRows& rows, int64_t o_begin,
                       int64_t o_end, float* y) {
  if (o_begin < 0 || o_end > w.n_out || o_begin > o_end)
    fail("matmul_rows_range: expected 0 <= o_begin <= o_end <= {}, found [{}, {})", w.n_out,
         o_begin, o_end);
  if (rows.n_rows == 0 || o_begin == o_end) return;
  run_outputs(rows_job("matmul_rows_range", 1, &w, y, rows), o_begin, o_end);
}

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_rows, float* y) {
  matmul(pool, w, x, n_rows, y, pool.scratch(pool.current_thread_index()));
}

void matvec(ThreadPool& pool, const WeightMatrix& w, const float* x, float* y) {
  matmul(pool, w, x, 1, y);
}

}  // namespace strata::compute
