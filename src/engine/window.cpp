#include "engine/window.h"

#include <algorithm>
#include <memory>

#include "backends/cpu_backend.h"
#include "util/error.h"
#include "util/phase_timer.h"

namespace strata {

void WindowRunner::run(compute::ThreadPool& pool, ModelState& state,
                       std::span<const int32_t> tokens, LogitRows rows, std::vector<float>& logits,
                       ExpertSource* experts) const {
  if (tokens.empty()) fail("forward: empty window");
  model_.check_tokens(tokens);
  state.window_log.valid = state.record_windows;
  if (state.record_windows) {
    state.window_log.n_past_before = state.n_past;
    state.window_log.tokens.assign(tokens.begin(), tokens.end());
  }
  const HParams& hp = model_.hparams();
  const int64_t n_rows = int64_t(tokens.size());
  compute::Backend& be = *state.backend;
  be.begin_window(pool);
  be.describe_window(model_.dims(), compute::Backend::WindowShape{n_rows, state.n_past,
                                                                  state.record_windows, int(rows)});
  model_.ensure_tensors(be, state.tensors, n_rows);
  const WindowSegment whole{&state, tokens, 0};
  const Model::WindowRun window{be, state.tensors, tokens, std::span(&whole, 1)};
  model_.start_window_inputs(window);
  model_.run_layers(window, experts ? *experts : model_.mapped_experts());
  state.n_past += n_rows;

  ScopedPart part(Part::Head);
  const WindowTensors& t = state.tensors;
  switch (rows) {
    case LogitRows::None:
      logits.clear();
      break;
    case LogitRows::Last:
      be.matmul(model_.output_head(), t.hidden, n_rows - 1, 1, t.logits);
      logits.resize(static_cast<size_t>(hp.n_vocab));
      be.read(t.logits, 0, 1, logits.data());
      break;
    case LogitRows::All:
      be.matmul(model_.output_head(), t.hidden, 0, n_rows, t.logits);
      logits.resize(static_cast<size_t>(n_rows * hp.n_vocab));
      be.read(t.logits, 0, n_rows, logits.data());
      break;
  }
}

void WindowRunner::run_batch(compute::ThreadPool& pool, BatchWindow& batch,
                             std::span<ModelState* const> states,
                             std::span<const std::span<const int32_t>> tokens,
                             std::span<std::vector<float>* const> logits,
                             ExpertSource* experts) const {
  if (states.empty()) fail("forward_batch: no sequences");
  if (tokens.size() != states.size() || logits.size() != states.size())
    fail("forward_batch: {} states, {} token lists and {} logit outputs (expected as many)",
         states.size(), tokens.size(), logits.size());
  batch.tokens.clear();
  batch.segments.clear();
  batch.rows.clear();
  int64_t longest = 0;
  for (size_t s = 0; s < states.size(); ++s) {
    ModelState& state = *states[s];
    if (tokens[s].empty()) fail("forward_batch: sequence {} has no tokens", s);
    if (state.record_windows)
      fail("forward_batch: sequence {} records its windows (speculative verify runs alone)", s);
    if (!state.backend || state.backend->name() != "cpu")
      fail(
          "forward_batch: sequence {} runs on the {} backend; batched windows need the cpu "
          "backend (the states must be host structs)",
          s, state.backend ? state.backend->name() : "no");
    for (size_t r = 0; r < s; ++r)
      if (states[r] == states[s]) fail("forward_batch: sequences {} and {} share a state", r, s);
    model_.check_tokens(tokens[s]);
    batch.segments.push_back(WindowSegment{&state, tokens[s], int64_t(batch.tokens.size())});
    batch.rows.push_back(
        compute::RowSegment{int64_t(batch.tokens.size()), int64_t(tokens[s].size())});
    batch.tokens.insert(batch.tokens.end(), tokens[s].begin(), tokens[s].end());
    longest = std::max<int64_t>(longest, int64_t(tokens[s].size()));
  }
  if (!batch.backend) batch.backend = std::make_unique<compute::CpuBackend>();
  compute::Backend& be = *batch.backend;
  const int64_t n_rows = int64_t(batch.tokens.size());
  be.begin_window(pool);
  model_.ensure_tensors(be, batch.tensors, n_rows);
  model_.ensure_tensors(be, batch.segment, longest);
  const Model::WindowRun window{be,     batch.tensors, batch.tokens, batch.segments,
                                &batch, &batch.segment};
  model_.start_window_inputs(window);
  model_.run_layers(window, experts ? *experts : model_.mapped_experts());

  ScopedPart part(Part::Head);
  // The head over each sequence's last row only: gathered into x (free by now), one matmul.
  const WindowTensors& t = batch.tensors;
  const int64_t n_seq = int64_t(states.size());
  for (int64_t s = 0; s < n_seq; ++s) {
    const WindowSegment& seg = batch.segments[size_t(s)];
    be.copy_rows(t.hidden, seg.first_row + int64_t(seg.tokens.size()) - 1, t.x, s, 1);
  }
  be.matmul(model_.output_head(), t.x, 0, n_seq, t.logits);
  for (int64_t s = 0; s < n_seq; ++s) {
    ModelState& state = *states[size_t(s)];
    state.window_log.valid = false;
    state.n_past += int64_t(tokens[size_t(s)].size());
    logits[size_t(s)]->resize(static_cast<size_t>(model_.hparams().n_vocab));
    be.read(t.logits, s, 1, logits[size_t(s)]->data());
  }
}

void WindowRunner::rollback(compute::ThreadPool& pool, ModelState& state, int64_t keep_rows) const {
  ModelState::WindowLog& log = state.window_log;
  if (!log.valid) fail("rollback: the last window was not run with record_windows set");
  const int64_t n_rows = int64_t(log.tokens.size());
  if (keep_rows < 0 || keep_rows > n_rows)
    fail("rollback: cannot keep {} rows of a {}-row window", keep_rows, n_rows);
  log.valid = false;
  const int64_t n_keep = log.n_past_before + keep_rows;
  model_.rollback_layers(pool, state, keep_rows, n_keep,
                         std::span<const int32_t>(log.tokens).first(size_t(keep_rows)));
  if (!state.residuals.empty()) {
    const size_t row = state.residuals.size() / size_t(n_rows);
    state.residuals.resize(row * size_t(keep_rows));
  }
  state.n_past = n_keep;
}

}  // namespace strata
