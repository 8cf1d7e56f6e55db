#include "layers/ple.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "compute/cpu/ops.h"
#include "compute/cpu/row_slices.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata {

std::vector<uint64_t> ple_row_ids(const PleDims& dims, const PleContext& context,
                                  std::span<const int32_t> tokens) {
  std::vector<uint64_t> rows;
  ple_row_ids(dims, context, tokens, rows);
  return rows;
}

void ple_row_ids(const PleDims& dims, const PleContext& context, std::span<const int32_t> tokens,
                 std::vector<uint64_t>& rows) {
  const int n_heads = dims.n_heads();
  const int per_ngram = dims.heads_per_ngram;
  const uint64_t eos = uint64_t(dims.eos_token);
  const uint64_t* m = dims.multipliers.data();
  rows.resize(tokens.size() * size_t(n_heads));
  // history(i) = token i-2 relative to the window; -1 means "before the sequence".
  auto history = [&](size_t i) -> int64_t { return i < 2 ? context.prev[i] : tokens[i - 2]; };
  auto is_cut = [&](int64_t id) { return id < 0 || uint64_t(id) == eos; };
  for (size_t t = 0; t < tokens.size(); ++t) {
    const size_t i = t + 2;
    const uint64_t c0 = uint64_t(history(i));
    const uint64_t c1 = is_cut(history(i - 1)) ? eos : uint64_t(history(i - 1));
    const uint64_t c2 = is_cut(history(i - 1)) || is_cut(history(i - 2)) ? eos
                                                                          : uint64_t(history(i - 2));
    const uint64_t mix2 = (c0 * m[0]) ^ (c1 * m[1]);
    const uint64_t mix3 = mix2 ^ (c2 * m[2]);
    for (int h = 0; h < n_heads; ++h) {
      const uint64_t mix = h < per_ngram ? mix2 : mix3;
      rows[t * size_t(n_heads) + size_t(h)] =
          mix % dims.head_vocab_sizes[size_t(h)] + dims.head_offsets[size_t(h)];
    }
  }
}

PleContext ple_advance(const PleDims&, PleContext context, std::span<const int32_t> tokens) {
  for (int32_t token : tokens) {
    context.prev[0] = context.prev[1];
    context.prev[1] = token;
  }
  return context;
}

PleRowReader::~PleRowReader() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {

// Row `row`'s bytes from the file into `raw` (one row long), or an error naming the file.
void pread_row(const PleWeights& w, uint64_t row, uint8_t* raw) {
  const size_t row_bytes = w.table.row_bytes();
  const uint64_t offset = w.table.file_offset + row * row_bytes;
  size_t done = 0;
  while (done < row_bytes) {
    const ssize_t got = pread(w.file->fd(), raw + done, row_bytes - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail("{}: reading n-gram row {} of {}: {}", w.file->path(), row, w.table.name,
           got < 0 ? std::strerror(errno) : "unexpected end of file");
    done += size_t(got);
  }
}

}  // namespace

bool PleRowReader::reads_from_mapping(const PleWeights& w) const {
  return w.file->mapped_data() != nullptr && w.table.n_bytes <= mapped_table_max_bytes_;
}

void PleRowReader::read_rows(const PleWeights& w, std::span<const uint64_t> rows) {
  const size_t row_bytes = w.table.row_bytes();
  const uint8_t* mapped = reads_from_mapping(w) ? w.file->tensor_data(w.table) : nullptr;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= uint64_t(w.table.ne[1]))
      fail("{}: tensor {}: n-gram row {} is outside the table ({} rows)", w.file->path(),
           w.table.name, rows[i], w.table.ne[1]);
    const uint8_t* bytes = mapped ? mapped + rows[i] * row_bytes : raw_.data();
    if (!mapped) pread_row(w, rows[i], raw_.data());
    quant::dequantize_row(w.table.type, bytes, out_.data() + i * size_t(width_), width_);
  }
}

void PleRowReader::start(const PleDims& dims, const PleWeights& w,
                         std::span<const uint64_t> row_ids) {
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
    weights_ = &w;
    width_ = dims.row_width;
    out_.resize(row_ids.size() * size_t(width_));
    error_ = nullptr;
    if (reads_from_mapping(w)) {
      // A small table: copied from the mapping here, on the window thread (see the header).
      try {
        read_rows(w, row_ids);
      } catch (...) {
        error_ = std::current_exception();
      }
      return;
    }
    rows_.assign(row_ids.begin(), row_ids.end());
    raw_.resize(w.table.row_bytes());
    done_ = false;
    has_job_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

const std::vector<float>& PleRowReader::collect() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return out_;
}

void PleRowReader::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return has_job_ || stop_; });
      if (stop_) return;
      has_job_ = false;
    }
    // The job's buffers belong to this thread until done_ is set.
    try {
      read_rows(*weights_, rows_);
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
  }
}

void PleState::reset(const PleDims& dims) {
  context = PleContext{};
  const int64_t width = dims.n_streams * dims.n_embd;
  conv_history.assign(static_cast<size_t>((dims.conv_kernel - 1) * dims.ngram_size * width), 0.0f);
}

namespace {

// Rough single-thread cost of a row's share of the layer outside its matmuls (three grouped norms,
// the scores and gates, the conv taps and a SiLU per element), for the pool's inline rule.
constexpr double kRowElementNs = 3.0;

// The row-wise part of the layer for rows [0, n_rows) of X and their embeddings: K, V, the gated
// values Gv into `gated` and N = G1p(Gv; nc) into `normed` ([n_rows][S·H] each). A row's results
// depend on that row alone (the matmul's rows are independent: compute/cpu/matmul.h), so any
// window of rows, and any split of the rows over threads, gives every row the same bits.
void ple_gates(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims, const PleWeights& w,
               const float* embeddings, int64_t n_rows, const float* X, float* gated, float* normed) {
  compute::Workspace::Frame frame(ws);
  const int S = dims.n_streams;
  const int64_t H = dims.n_embd, width = S * H;
  std::vector<float>& keys = ws.floats(static_cast<size_t>(n_rows * width));
  std::vector<float>& values = ws.floats(static_cast<size_t>(n_rows * H));
  // Both read the embeddings: one conversion, one hand-out (each bitwise its own matmul).
  const compute::MatmulProduct products[] = {{&w.key, keys.data()}, {&w.value, values.data()}};
  compute::matmul_many(pool, products, embeddings, n_rows);

  std::vector<float>& queries = ws.floats(static_cast<size_t>(n_rows * width));
  const float inv_sqrt_h = 1.0f / std::sqrt(float(H));
  pool.parallel_for(n_rows, double(n_rows * width) * kRowElementNs, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float* key = keys.data() + t * width;
      float* query = queries.data() + t * width;
      compute::rms_norm_grouped(key, w.norm_key.data(), S, H, dims.rms_eps, key);
      compute::rms_norm_grouped(X + t * width, w.norm_query.data(), S, H, dims.rms_eps, query);
      for (int s = 0; s < S; ++s) {
        float score = 0.0f;
        for (int64_t i = 0; i < H; ++i) score += key[s * H + i] * query[s * H + i];
        score *= inv_sqrt_h;
        const float magnitude = std::sqrt(std::max(std::fabs(score), 1e-6f));
        const float gate = compute::sigmoid(score < 0 ? -magnitude : (score > 0 ? magnitude : 0.0f));
        for (int64_t i = 0; i < H; ++i) gated[t * width + s * H + i] = gate * values[size_t(t * H + i)];
      }
      compute::rms_norm_grouped(gated + t * width, w.norm_conv.data(), S, H, dims.rms_eps, normed + t * width);
    }
  });
}

// One sequence's rows for the conv part (their Gv and N from ple_gates, their rows of X) and the
// conv history before them.
struct ConvRows {
  const std::vector<float>* history;
  const float* gated;
  const float* normed;
  float* X;
  int64_t n_rows;
};

// The conv part of row t of `rows`: the dilated causal depthwise conv over [history | N], then
// X_t += Gv_t + silu(conv). The sums first, then their SiLU in one vector call (bitwise the scalar
// silu; one expf per channel was most of a decode row's PLE time), then the adds. Rows are
// independent (each reads N and the history only): any split over threads gives the same bits.
void ple_conv_row(const PleDims& dims, const PleWeights& w, const ConvRows& rows, int64_t t, float* conv) {
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd;
  const int kernel = dims.conv_kernel, dilation = dims.ngram_size;
  const int64_t history_steps = int64_t(kernel - 1) * dilation;
  auto step = [&](int64_t back) -> const float* {  // N at t - back
    const int64_t idx = t - back;
    return idx >= 0 ? rows.normed + idx * width : rows.history->data() + (history_steps + idx) * width;
  };
  for (int64_t c = 0; c < width; ++c) {
    const float* taps = w.conv.data() + c * kernel;
    float sum = 0.0f;
    for (int j = 0; j < kernel; ++j) sum += taps[j] * step(int64_t(kernel - 1 - j) * dilation)[c];
    conv[c] = sum;
  }
  compute::silu(conv, width, conv);
  float* xt = rows.X + t * width;
  for (int64_t c = 0; c < width; ++c) xt[c] += rows.gated[t * width + c] + conv[c];
}

// The conv part of every row of `sequences` (row r of all of them together: sequences[s]'s rows
// in order), split over the pool's threads, each with its own scratch row.
void ple_conv(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims, const PleWeights& w,
              std::span<const ConvRows> sequences) {
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd;
  int64_t n_rows = 0;
  for (const ConvRows& rows : sequences) n_rows += rows.n_rows;
  ws.reserve_threads(pool.size());
  pool.parallel_for(n_rows, double(n_rows * width) * kRowElementNs, [&](int64_t begin, int64_t end, int thread) {
    compute::Workspace& thread_ws = ws.for_thread(thread);
    compute::Workspace::Frame frame(thread_ws);
    float* conv = thread_ws.scratch_floats(static_cast<size_t>(width)).data();
    // The sequence holding row `begin`, then onwards.
    size_t s = 0;
    int64_t first = 0;
    while (first + sequences[s].n_rows <= begin) first += sequences[s++].n_rows;
    for (int64_t r = begin; r < end; ++r) {
      while (r - first >= sequences[s].n_rows) first += sequences[s++].n_rows;
      ple_conv_row(dims, w, sequences[s], r - first, conv);
    }
  });
}

// The history after `rows` (the last (K-1)·n rows of [history | N]) into next_history.
void ple_next_history(const PleDims& dims, const ConvRows& rows, std::vector<float>& next_history) {
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd;
  const int64_t history_steps = int64_t(dims.conv_kernel - 1) * dims.ngram_size;
  next_history.resize(rows.history->size());
  for (int64_t i = 0; i < history_steps; ++i) {
    const int64_t idx = rows.n_rows - history_steps + i;  // window-relative
    const float* src = idx >= 0 ? rows.normed + idx * width : rows.history->data() + (history_steps + idx) * width;
    std::copy_n(src, width, next_history.data() + i * width);
  }
}

}  // namespace

void ple_forward(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims,
                 const PleWeights& w, PleState& state, const float* embeddings, int64_t n_rows,
                 float* X, bool record_window) {
  compute::Workspace::Frame frame(ws);
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd;
  std::vector<float>& gated = ws.floats(static_cast<size_t>(n_rows * width));
  std::vector<float>& window_normed = ws.floats(static_cast<size_t>(n_rows * width));
  if (record_window) state.spare_normed.assign(static_cast<size_t>(n_rows * width), 0.0f);
  std::vector<float>& normed = record_window ? state.spare_normed : window_normed;
  ple_gates(pool, ws, dims, w, embeddings, n_rows, X, gated.data(), normed.data());
  const ConvRows rows[1] = {{&state.conv_history, gated.data(), normed.data(), X, n_rows}};
  ple_conv(pool, ws, dims, w, rows);
  ple_next_history(dims, rows[0], state.next_history);
  state.window_log.valid = false;
  if (record_window) {
    PleWindowLog& log = state.window_log;
    log.context_before = state.context;
    log.history_before.swap(state.conv_history);
    log.normed.swap(state.spare_normed);
    log.n_rows = n_rows;
    log.valid = true;
  }
  state.conv_history.swap(state.next_history);  // next_history takes the old buffer
}

void ple_forward_rows(compute::ThreadPool& pool, compute::Workspace& ws, const PleDims& dims,
                      const PleWeights& w, std::span<PleState* const> states,
                      std::span<const float* const> embeddings, std::span<const compute::RowSegment> segments,
                      int64_t n_rows, float* X) {
  if (states.size() != segments.size() || embeddings.size() != segments.size())
    fail("ple: {} states and {} embedding blocks for {} row segments", states.size(), embeddings.size(),
         segments.size());
  compute::Workspace::Frame frame(ws);
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd, embedding_width = w.key.n_in;
  // Every sequence's embeddings as one block of rows (each sequence's reader holds its own).
  std::vector<float>& all_embeddings = ws.floats(static_cast<size_t>(n_rows * embedding_width));
  for (size_t s = 0; s < segments.size(); ++s)
    std::copy_n(embeddings[s], segments[s].n_rows * embedding_width,
                all_embeddings.data() + segments[s].first_row * embedding_width);
  std::vector<float>& gated = ws.floats(static_cast<size_t>(n_rows * width));
  std::vector<float>& normed = ws.floats(static_cast<size_t>(n_rows * width));
  std::vector<ConvRows> sequences;
  sequences.reserve(segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    const int64_t first = segments[s].first_row;
    sequences.push_back({&states[s]->conv_history, gated.data() + first * width, normed.data() + first * width,
                         X + first * width, segments[s].n_rows});
  }
  if (compute::takes_sequence_slices(pool, segments, n_rows)) {
    // A batched decode step by row slices (compute/cpu/row_slices.h): each thread takes the whole
    // sequences of its slice through the gates and the conv, one hand-out instead of three, on
    // its own workspace. The same rows' work as below, row by row.
    ws.reserve_threads(pool.size());
    compute::for_each_sequence_slice(pool, segments, n_rows, [&](size_t s_first, size_t s_last, int64_t first,
                                                                 int64_t n, int thread) {
      compute::Workspace& thread_ws = ws.for_thread(thread);
      ple_gates(pool, thread_ws, dims, w, all_embeddings.data() + first * embedding_width, n,
                X + first * width, gated.data() + first * width, normed.data() + first * width);
      ple_conv(pool, thread_ws, dims, w,
               std::span<const ConvRows>(sequences).subspan(s_first, s_last - s_first));
    });
  } else {
    ple_gates(pool, ws, dims, w, all_embeddings.data(), n_rows, X, gated.data(), normed.data());
    ple_conv(pool, ws, dims, w, sequences);
  }
  for (size_t s = 0; s < segments.size(); ++s) {
    PleState& state = *states[s];
    ple_next_history(dims, sequences[s], state.next_history);
    state.window_log.valid = false;
    state.conv_history.swap(state.next_history);
  }
}

void ple_rollback(const PleDims& dims, PleState& state, std::span<const int32_t> kept_tokens) {
  PleWindowLog& log = state.window_log;
  if (!log.valid) fail("ple rollback: the last window was not recorded");
  const int64_t keep_rows = int64_t(kept_tokens.size());
  if (keep_rows > log.n_rows)
    fail("ple rollback: cannot keep {} rows of a {}-row window", keep_rows, log.n_rows);
  log.valid = false;
  if (keep_rows == log.n_rows) return;
  const int64_t width = int64_t(dims.n_streams) * dims.n_embd;
  const int64_t history_steps = int64_t(dims.conv_kernel - 1) * dims.ngram_size;
  for (int64_t i = 0; i < history_steps; ++i) {
    const int64_t idx = keep_rows - history_steps + i;  // window-relative
    const float* src = idx >= 0 ? log.normed.data() + idx * width
                                : log.history_before.data() + (history_steps + idx) * width;
    std::copy_n(src, width, state.conv_history.data() + i * width);
  }
  state.context = ple_advance(dims, log.context_before, kept_tokens);
}

void ple_rollback_context(const PleDims& dims, PleState& state,
                          std::span<const int32_t> kept_tokens) {
  PleWindowLog& log = state.window_log;
  if (!log.valid) fail("ple rollback: the last window was not recorded");
  if (int64_t(kept_tokens.size()) > log.n_rows)
    fail("ple rollback: cannot keep {} rows of a {}-row window", kept_tokens.size(), log.n_rows);
  log.valid = false;
  state.context = ple_advance(dims, log.context_before, kept_tokens);
}

}  // namespace strata
