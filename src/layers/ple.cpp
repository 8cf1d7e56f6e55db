#include "layers/ple.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "compute/cpu/ops.h"
#include "quant/quant.h"
#include "util/error.h"

namespace strata {

std::vector<uint64_t> ple_row_ids(const HParams& hp, const PleContext& context,
                                  std::span<const int32_t> tokens) {
  const int n_heads = hp.ple_n_heads();
  const int per_ngram = hp.ple_heads_per_ngram;
  const uint64_t eos = uint64_t(hp.ple_eos_token);
  const uint64_t* m = hp.ple_multipliers.data();
  std::vector<uint64_t> rows(tokens.size() * size_t(n_heads));
  // history[i] = token i-2 relative to the window; -1 means "before the sequence".
  std::vector<int64_t> history = {context.prev[0], context.prev[1]};
  for (int32_t token : tokens) history.push_back(token);
  auto is_cut = [&](int64_t id) { return id < 0 || uint64_t(id) == eos; };
  for (size_t t = 0; t < tokens.size(); ++t) {
    const size_t i = t + 2;
    const uint64_t c0 = uint64_t(history[i]);
    const uint64_t c1 = is_cut(history[i - 1]) ? eos : uint64_t(history[i - 1]);
    const uint64_t c2 = is_cut(history[i - 1]) || is_cut(history[i - 2]) ? eos
                                                                          : uint64_t(history[i - 2]);
    const uint64_t mix2 = (c0 * m[0]) ^ (c1 * m[1]);
    const uint64_t mix3 = mix2 ^ (c2 * m[2]);
    for (int h = 0; h < n_heads; ++h) {
      const uint64_t mix = h < per_ngram ? mix2 : mix3;
      rows[t * size_t(n_heads) + size_t(h)] =
          mix % hp.ple_head_vocab_sizes[size_t(h)] + hp.ple_head_offsets[size_t(h)];
    }
  }
  return rows;
}

PleContext ple_advance(const HParams&, PleContext context, std::span<const int32_t> tokens) {
  for (int32_t token : tokens) {
    context.prev[0] = context.prev[1];
    context.prev[1] = token;
  }
  return context;
}

void PleRowReader::start(const HParams& hp, const PleWeights& w, std::vector<uint64_t> row_ids) {
  const int64_t width = hp.ple_row_width;
  pending_ = std::async(std::launch::async, [&w, width, rows = std::move(row_ids)] {
    const TensorInfo& table = w.table;
    const size_t row_bytes = table.row_bytes();
    std::vector<uint8_t> raw(row_bytes);
    std::vector<float> out(rows.size() * size_t(width));
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] >= uint64_t(table.ne[1]))
        fail("{}: tensor {}: n-gram row {} is outside the table ({} rows)", w.file->path(),
             table.name, rows[i], table.ne[1]);
      const uint64_t offset = table.file_offset + rows[i] * row_bytes;
      size_t done = 0;
      while (done < row_bytes) {
        const ssize_t got = pread(w.file->fd(), raw.data() + done, row_bytes - done,
                                  off_t(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
          fail("{}: reading n-gram row {} of {}: {}", w.file->path(), rows[i], table.name,
               got < 0 ? std::strerror(errno) : "unexpected end of file");
        done += size_t(got);
      }
      quant::dequantize_row(table.type, raw.data(), out.data() + i * size_t(width), width);
    }
    return out;
  });
}

std::vector<float> PleRowReader::collect() { return pending_.get(); }

void PleState::reset(const HParams& hp) {
  context = PleContext{};
  const int64_t width = hp.hc_count * hp.n_embd;
  conv_history.assign(static_cast<size_t>((hp.ple_conv_kernel - 1) * hp.ple_ngram_size * width), 0.0f);
}

void ple_forward(compute::ThreadPool& pool, const HParams& hp, const PleWeights& w,
                 PleState& state, const float* embeddings, int64_t n_rows, float* X,
                 bool record_window) {
  const int S = hp.hc_count;
  const int64_t H = hp.n_embd, width = S * H;
  const int kernel = hp.ple_conv_kernel, dilation = hp.ple_ngram_size;
  const int64_t history_steps = int64_t(kernel - 1) * dilation;

  std::vector<float> keys(static_cast<size_t>(n_rows * width)), values(static_cast<size_t>(n_rows * H));
  compute::matmul(pool, w.key, embeddings, n_rows, keys.data());
  compute::matmul(pool, w.value, embeddings, n_rows, values.data());

  std::vector<float> query(static_cast<size_t>(width)), gated(static_cast<size_t>(n_rows * width));
  std::vector<float> normed(static_cast<size_t>(n_rows * width));
  const float inv_sqrt_h = 1.0f / std::sqrt(float(H));
  for (int64_t t = 0; t < n_rows; ++t) {
    float* key = keys.data() + t * width;
    compute::rms_norm_grouped(key, w.norm_key.data(), S, H, hp.rms_eps, key);
    compute::rms_norm_grouped(X + t * width, w.norm_query.data(), S, H, hp.rms_eps, query.data());
    for (int s = 0; s < S; ++s) {
      float score = 0.0f;
      for (int64_t i = 0; i < H; ++i) score += key[s * H + i] * query[size_t(s * H + i)];
      score *= inv_sqrt_h;
      const float magnitude = std::sqrt(std::max(std::fabs(score), 1e-6f));
      const float gate = compute::sigmoid(score < 0 ? -magnitude : (score > 0 ? magnitude : 0.0f));
      for (int64_t i = 0; i < H; ++i)
        gated[size_t(t * width + s * H + i)] = gate * values[size_t(t * H + i)];
    }
    compute::rms_norm_grouped(gated.data() + t * width, w.norm_conv.data(), S, H, hp.rms_eps,
                              normed.data() + t * width);
  }

  // Dilated causal depthwise conv over [history | window], then X += Gv + silu(conv).
  for (int64_t t = 0; t < n_rows; ++t) {
    auto step = [&](int64_t back) -> const float* {  // N at t - back
      const int64_t idx = t - back;
      return idx >= 0 ? normed.data() + idx * width
                      : state.conv_history.data() + (history_steps + idx) * width;
    };
    float* xt = X + t * width;
    for (int64_t c = 0; c < width; ++c) {
      const float* taps = w.conv.data() + c * kernel;
      float sum = 0.0f;
      for (int j = 0; j < kernel; ++j) sum += taps[j] * step(int64_t(kernel - 1 - j) * dilation)[c];
      xt[c] += gated[size_t(t * width + c)] + compute::silu(sum);
    }
  }
  // Keep the last history_steps rows of N.
  std::vector<float> next(state.conv_history.size());
  for (int64_t i = 0; i < history_steps; ++i) {
    const int64_t idx = n_rows - history_steps + i;  // window-relative
    const float* src = idx >= 0 ? normed.data() + idx * width
                                : state.conv_history.data() + (history_steps + idx) * width;
    std::copy_n(src, width, next.data() + i * width);
  }
  state.window_log.valid = false;
  if (record_window) {
    PleWindowLog& log = state.window_log;
    log.context_before = state.context;
    log.history_before = std::move(state.conv_history);
    log.normed = std::move(normed);
    log.n_rows = n_rows;
    log.valid = true;
  }
  state.conv_history = std::move(next);
}

void ple_rollback(const HParams& hp, PleState& state, std::span<const int32_t> kept_tokens) {
  PleWindowLog& log = state.window_log;
  if (!log.valid) fail("ple rollback: the last window was not recorded");
  const int64_t keep_rows = int64_t(kept_tokens.size());
  if (keep_rows > log.n_rows)
    fail("ple rollback: cannot keep {} rows of a {}-row window", keep_rows, log.n_rows);
  log.valid = false;
  if (keep_rows == log.n_rows) return;
  const int64_t width = int64_t(hp.hc_count) * hp.n_embd;
  const int64_t history_steps = int64_t(hp.ple_conv_kernel - 1) * hp.ple_ngram_size;
  for (int64_t i = 0; i < history_steps; ++i) {
    const int64_t idx = keep_rows - history_steps + i;  // window-relative
    const float* src = idx >= 0 ? log.normed.data() + idx * width
                                : log.history_before.data() + (history_steps + idx) * width;
    std::copy_n(src, width, state.conv_history.data() + i * width);
  }
  state.context = ple_advance(hp, log.context_before, kept_tokens);
}

}  // namespace strata
